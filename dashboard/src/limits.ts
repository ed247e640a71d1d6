// A key's limit state as the Keys view (operator) and the Statistics view (an
// API key's own) show it: each named policy with its limit, remaining and reset
// (docs/limits.md), and the concurrency quota's slots in use.

import type * as api from './api';
import { h, meter, relative, scroller, table, td, time } from './dom';

/** Each policy's numbers now, with a bar of what remains; `who` names the key in the labels. */
export function policyTable(policies: api.PolicyState[], who: string): HTMLElement {
  if (!policies.length) return h('p', null, 'No policy applies (the key is revoked, or its plan is no longer configured).');
  const rows = policies.map((p) =>
    h(
      'tr',
      { 'data-policy': p.name },
      h('th', { scope: 'row' }, p.name),
      td(p.limit),
      td(h('span', { class: 'remaining' }, p.remaining), ' ', meter(`${p.name}: ${p.remaining} of ${p.limit} remaining`, p.remaining, p.limit, 'high')),
      td(`${time(p.reset * 1000)} (${relative(p.reset * 1000)})`),
      td(`${p.window_s} s`),
    ),
  );
  return scroller(`Policies of ${who}`, table(`Policies of ${who}`, ['Policy', 'Limit', 'Remaining', 'Resets (UTC)', 'Window'], rows));
}

/** The concurrency quota, when the plan has one. */
export function inflightLine(inflight: api.Inflight | undefined): HTMLElement | null {
  if (!inflight) return null;
  const text = `${inflight.in_use} of ${inflight.limit} in-flight slots in use`;
  return h('p', { class: 'inflight' }, text, ' ', meter(text, inflight.in_use, inflight.limit, 'low'));
}
