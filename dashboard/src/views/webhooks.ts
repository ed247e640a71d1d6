// Webhooks: the project's subscriptions with each endpoint's health (its last
// 24 h: attempts, the share answered 2xx, the last attempt, a state); create
// (the secret shown once, with a copy button), rotate the secret, delete;
// pause/resume, send a test ping and recover the failed deliveries of the last
// 14 days (docs/operating-webhooks.md); the limit its receiver advertised, to
// which the gateway paces deliveries (docs/webhooks.md "Receivers that say how fast"). The operator picks a project and reads
// it (changing a project's webhooks stays the project's).

import * as api from '../api';
import { button, field, h, ident, input, projectField, replace, scroller, secretBox, status, table, td, time, when } from '../dom';

/** "97.5 % of 40" — the share of the window's attempts answered 2xx. */
export function successText(hl: api.SubscriptionHealth | undefined): string {
  if (!hl || hl.success_rate === null) return 'no attempts';
  const pct = hl.success_rate * 100;
  return `${Number.isInteger(pct) ? pct : pct.toFixed(1)} % of ${hl.attempts}`;
}

function lastAttempt(hl: api.SubscriptionHealth | undefined): HTMLElement | string {
  if (!hl || hl.last_attempt_at === null) return '—';
  const outcome = hl.last_status_code !== null ? `HTTP ${hl.last_status_code}` : (hl.last_error ?? 'no answer');
  return h('span', null, when(hl.last_attempt_at), ' ', h('span', { class: 'nowrap' }, outcome));
}

/** "0 left, resets 2027-01-15 08:00:00Z" — what the receiver last advertised (RateLimit, X-RateLimit-*). */
function receiverLimit(s: api.Subscription): HTMLElement | string {
  const l = s.receiver_limit;
  if (!l) return 'none advertised';
  return h(
    'span',
    { 'data-remaining': l.remaining, 'data-reset-at': l.reset_at },
    h('span', { class: 'nowrap' }, `${l.remaining} left`),
    ', resets ',
    when(l.reset_at),
    l.remaining === 0 ? h('small', { class: 'hint' }, ' (deliveries wait until then)') : null,
  );
}

/** The operator's view of one project: the list only. */
async function readOnly(main: HTMLElement): Promise<void> {
  const project = projectField();
  const msg = h('p', { class: 'status' });
  const list = h('div');
  const form = h('form', { class: 'filters', role: 'search', 'aria-label': 'Whose webhooks' }, field('Project', project), h('button', { type: 'submit' }, 'Show webhooks'));
  const load = async (): Promise<void> => {
    const p = project.value.trim();
    if (!p) {
      status(msg, 'Enter a project to see its webhooks.');
      replace(list);
      return;
    }
    const page = await api.call<api.Page<api.Subscription>>('GET', '/webhooks', { query: { project: p, limit: 100 } });
    replace(list, page.data.length ? subscriptionTable(page.data, () => null, p) : h('p', null, `Project ${p} has no subscriptions.`));
    status(msg, `${page.data.length} ${page.data.length === 1 ? 'subscription' : 'subscriptions'} of project ${p}.`);
  };
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    load().catch((e) => status(msg, api.describe(e), 'error'));
  });
  main.append(form, h('p', { class: 'readonly-note' }, 'As the operator you read a project’s webhooks; the project changes them (its API keys or a portal link).'), msg, h('h2', null, 'Subscriptions'), list);
  await load();
}

/** The subscriptions with their health; `actions` gives a row's buttons (none for the operator). */
function subscriptionTable(subs: api.Subscription[], actions: (s: api.Subscription) => HTMLTableCellElement | null, project?: string): HTMLElement {
  const cells = subs.map(actions);
  const rows = subs.map((s, i) => {
    const hl = s.health;
    const state = s.state === 'disabled' ? `disabled (${s.disabled_reason ?? ''})` : (s.state ?? 'active');
    const deliveries = new URLSearchParams({ subscription_id: s.id });
    if (project) deliveries.set('project', project);
    return h(
      'tr',
      { 'data-subscription-id': s.id },
      h('td', { class: 'url' }, h('code', null, s.url)),
      td(s.events.join(', ')),
      td(s.description ?? ''),
      td(state),
      h('td', { class: 'health' }, h('span', { class: `badge h-${hl?.state ?? 'idle'}` }, hl?.state ?? 'idle')),
      h('td', { class: 'success nowrap' }, successText(hl)),
      h('td', { class: 'last-attempt' }, lastAttempt(hl)),
      h('td', { class: 'receiver-limit' }, receiverLimit(s)),
      td(ident(s.id), h('br'), h('small', { class: 'hint nowrap' }, `created ${time(s.created_at)}`), h('br'), h('a', { href: `#deliveries?${deliveries}`, 'aria-label': `Deliveries to ${s.url}` }, 'Deliveries')),
      cells[i],
    );
  });
  const headers = ['URL', 'Events', 'Description', 'State', 'Health (24 h)', 'Success (24 h)', 'Last attempt (UTC)', 'Receiver limit (UTC)', 'ID'];
  if (cells.some((c) => c !== null)) headers.push('Actions');
  return scroller('Subscriptions', table('Subscriptions with their endpoint’s health over the last 24 hours', headers, rows));
}

export async function webhooks(main: HTMLElement): Promise<void> {
  if (api.credential()?.kind === 'operator') return readOnly(main);
  const url = input('url', { type: 'url', required: true, placeholder: 'https://example.com/hooks' });
  const events = input('events', { value: '*' });
  const description = input('description');
  const created = h('div', { class: 'once' });
  const msg = h('p', { class: 'status' });
  const list = h('div');
  const form = h(
    'form',
    { class: 'filters', 'aria-labelledby': 'new-sub-title', novalidate: true },
    h('h2', { id: 'new-sub-title' }, 'New subscription'),
    field('Endpoint URL', url),
    field('Events', events, 'Comma-separated: payment.succeeded, payment.*, or * for every event'),
    field('Description', description),
    h('button', { type: 'submit' }, 'Create subscription'),
  );

  const load = async (): Promise<void> => {
    const page = await api.call<api.Page<api.Subscription>>('GET', '/webhooks', { query: { limit: 100 } });
    if (!page.data.length) {
      replace(list, h('p', null, 'No subscriptions yet.'));
      return;
    }
    const actionsOf = (s: api.Subscription): HTMLTableCellElement => {
      const actions = h('td', { class: 'actions stack' });
      const rotate = button('Rotate secret', () => {
        api
          .call<{ secret: string }>('POST', `/webhooks/${encodeURIComponent(s.id)}/rotate-secret`)
          .then((r) => {
            replace(created, secretBox(`New signing secret for ${s.url}`, r.secret), h('p', null, 'The previous secret keeps signing for 24 hours.'));
            status(msg, 'Secret rotated.', 'ok');
          })
          .catch((e) => status(msg, api.describe(e), 'error'));
      }, { 'aria-label': `Rotate secret of ${s.url}` });
      const del = button('Delete', () => {
        const confirm = button('Confirm delete', () => {
          api
            .call('DELETE', `/webhooks/${encodeURIComponent(s.id)}`)
            .then(() => load())
            .then(() => status(msg, `Subscription ${s.id} deleted.`, 'ok'))
            .catch((e) => status(msg, api.describe(e), 'error'));
        }, { class: 'danger', 'aria-label': `Confirm delete of the subscription to ${s.url}` });
        const cancel = button('Cancel', () => replace(actions, toggle, test, recover, rotate, del), { 'aria-label': `Cancel deleting the subscription to ${s.url}` });
        replace(actions, confirm, cancel);
        confirm.focus();
      }, { class: 'danger', 'aria-label': `Delete the subscription to ${s.url}` });
      const path = `/webhooks/${encodeURIComponent(s.id)}`;
      const paused = (s.state ?? 'active') !== 'active';
      const toggle = button(paused ? 'Resume' : 'Pause', () => {
        api
          .call<api.Subscription>('POST', `${path}/${paused ? 'resume' : 'pause'}`)
          .then((r) => load().then(() => status(msg, `Subscription ${r.id} is ${r.state}.`, 'ok')))
          .catch((e) => status(msg, api.describe(e), 'error'));
      }, { 'aria-label': `${paused ? 'Resume' : 'Pause'} the subscription to ${s.url}` });
      const test = button('Send test', () => {
        status(msg, `Sending a test ping to ${s.url}…`);
        api
          .call<api.TestResult>('POST', `${path}/test`)
          .then((r) => {
            const outcome = r.status_code === null ? `no answer: ${r.error ?? ''}` : `HTTP ${r.status_code}`;
            status(msg, `Test ping to ${s.url}: ${outcome} in ${r.duration_ms} ms.`, r.status_code !== null && r.status_code < 300 ? 'ok' : 'error');
          })
          .catch((e) => status(msg, api.describe(e), 'error'));
      }, { 'aria-label': `Send test ping to ${s.url}` });
      const recover = button('Recover failed', () => {
        const since = Date.now() - 14 * 86_400_000;
        api
          .call<{ id: string }>('POST', `${path}/recover`, { body: { since } })
          .then((t) => watchTask(t.id, s.url))
          .catch((e) => status(msg, api.describe(e), 'error'));
      }, { 'aria-label': `Recover failed deliveries of the last 14 days to ${s.url}` });
      actions.append(toggle, test, recover, rotate, del);
      return actions;
    };
    replace(list, subscriptionTable(page.data, actionsOf));
  };

  /** Reports a recover task until it is done (or failed). */
  const watchTask = async (id: string, url: string): Promise<void> => {
    for (let i = 0; i < 120; i++) {
      const t = await api.call<api.Task>('GET', `/tasks/${encodeURIComponent(id)}`);
      const counts = `${t.done} of ${t.total} re-sent, ${t.failed} failed`;
      if (t.state === 'done' || t.state === 'failed') {
        status(msg, `Recover for ${url} ${t.state}: ${counts}.`, t.state === 'done' ? 'ok' : 'error');
        return;
      }
      status(msg, `Recover for ${url} ${t.state}: ${counts}…`);
      await new Promise((r) => setTimeout(r, 500));
    }
  };

  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const body: Record<string, unknown> = {
      url: url.value.trim(),
      events: events.value.split(',').map((e) => e.trim()).filter(Boolean),
    };
    if (description.value.trim()) body.description = description.value.trim();
    api
      .call<api.CreatedSubscription>('POST', '/webhooks', { body })
      .then((s) => {
        replace(created, secretBox(`Signing secret for ${s.url}`, s.secret));
        status(msg, `Subscription ${s.id} created.`, 'ok');
        form.reset();
        return load();
      })
      .catch((e) => status(msg, api.describe(e), 'error'));
  });

  main.append(form, msg, created, h('h2', null, 'Subscriptions'), list);
  await load();
}
