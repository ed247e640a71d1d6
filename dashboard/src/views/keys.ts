// Keys (operator only): create (the key shown once), list, revoke, per-key
// statistics; and portal links for integrators.

import * as api from '../api';
import { button, field, h, input, replace, scroller, secretBox, status, table, td, time } from '../dom';

export async function keys(main: HTMLElement): Promise<void> {
  const msg = h('p', { class: 'status' });
  const once = h('div', { class: 'once' });
  const list = h('div');

  const project = input('project', { required: true, placeholder: 'acme' });
  const plan = input('plan', { value: 'trial' });
  const name = input('name');
  const create = h(
    'form',
    { class: 'filters', 'aria-labelledby': 'new-key-title', novalidate: true },
    h('h2', { id: 'new-key-title' }, 'New API key'),
    field('Project', project),
    field('Plan', plan),
    field('Name', name),
    h('button', { type: 'submit' }, 'Create key'),
  );
  create.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const body: Record<string, string> = { project: project.value.trim(), plan: plan.value.trim() };
    if (name.value.trim()) body.name = name.value.trim();
    api
      .call<api.KeyRecord>('POST', '/keys', { body })
      .then((k) => {
        replace(once, secretBox(`API key ${k.prefix}… for ${k.project}`, k.key ?? ''));
        return load().then(() => status(msg, `Key ${k.id} created.`, 'ok'));
      })
      .catch((e) => status(msg, api.describe(e), 'error'));
  });

  const linkProject = input('portal_project', { required: true, placeholder: 'acme' });
  const ttl = input('ttl_s', { type: 'number', min: 5, max: 86400, value: 3600 });
  const portal = h(
    'form',
    { class: 'filters', 'aria-labelledby': 'portal-title', novalidate: true },
    h('h2', { id: 'portal-title' }, 'Portal link'),
    field('Project', linkProject),
    field('Valid for (seconds)', ttl, 'Single use; the session it opens ends when the link expires (at most 24 h).'),
    h('button', { type: 'submit' }, 'Create portal link'),
  );
  portal.addEventListener('submit', (ev) => {
    ev.preventDefault();
    api
      .call<{ url: string; expires_at: number }>('POST', '/portal-links', {
        body: { project: linkProject.value.trim(), ttl_s: Number(ttl.value) },
      })
      .then((l) => {
        replace(once, secretBox(`Portal link for ${linkProject.value.trim()} (until ${time(l.expires_at)})`, l.url));
        status(msg, 'Portal link created.', 'ok');
      })
      .catch((e) => status(msg, api.describe(e), 'error'));
  });

  const load = async (): Promise<void> => {
    const page = await api.call<api.Page<api.KeyRecord>>('GET', '/keys', { query: { limit: 100 } });
    if (!page.data.length) {
      replace(list, h('p', null, 'No keys yet.'));
      return;
    }
    const rows = page.data.map((k) => {
      const actions = h('td', { class: 'actions' });
      actions.append(h('a', { href: `#statistics?key_prefix=${encodeURIComponent(k.prefix)}`, 'aria-label': `Statistics of key ${k.prefix}` }, 'Statistics'));
      if (k.revoked_at === null) {
        actions.append(
          button('Revoke', () => {
            api
              .call('DELETE', `/keys/${encodeURIComponent(k.id)}`)
              .then(() => load())
              .then(() => status(msg, `Key ${k.prefix}… revoked.`, 'ok'))
              .catch((e) => status(msg, api.describe(e), 'error'));
          }, { class: 'danger', 'aria-label': `Revoke key ${k.prefix}` }),
        );
      }
      return h(
        'tr',
        { 'data-key-id': k.id },
        td(h('code', null, `${k.prefix}…`)),
        td(k.project),
        td(k.plan),
        td(k.name ?? ''),
        td(time(k.created_at)),
        td(k.revoked_at === null ? 'active' : `revoked ${time(k.revoked_at)}`),
        actions,
      );
    });
    replace(list, scroller('API keys', table('API keys', ['Prefix', 'Project', 'Plan', 'Name', 'Created (UTC)', 'State', 'Actions'], rows)));
  };

  main.append(create, portal, msg, once, h('h2', null, 'API keys'), list);
  await load();
}
