// Ordering keys (ADR 0043, docs/webhooks.md): per subscription and key, deliveries go in
// publish order, so a delivery whose predecessor in its lane is not delivered or dead-lettered
// yet waits for it (`blocked_by`). The views show the key and the wait, as text; the wait is a
// button that opens the delivery waited for.

import type * as api from './api';
import { h, replace } from './dom';

/** An ordering key, or "—" for an event published without one. */
export function orderingKey(key: string | null | undefined): HTMLElement | string {
  return key ? h('code', { class: 'ordering-key' }, key) : '—';
}

/** Fills `cell` with `d`'s ordering key and, while it waits, "waiting for <id>" (which `open`s that delivery). */
export function showOrdering(cell: HTMLElement, d: api.Ordered, open: (id: string) => void): void {
  const before = d.blocked_by;
  const wait = before
    ? h(
        'button',
        { type: 'button', class: 'waiting', 'data-blocked-by': before, on: { click: () => open(before) } },
        'waiting for ',
        h('code', { class: 'id', title: before }, before),
      )
    : null;
  replace(cell, orderingKey(d.ordering_key), wait ? h('br') : null, wait);
}
