// Keys (operator only): create (the key shown once); the list with each key's
// plan, expiry, whether it has metadata and when it was last used (from the audit
// log, `GET /keys/activity`, one call per project on the page); a key's detail (its metadata and
// overrides as text, each policy's remaining, the in-flight slots) with edit
// (PATCH) and reroll (the new secret shown once); revoke; per-key statistics;
// and portal links for integrators (docs/operator-api.md, docs/dashboard-and-portal.md).

import * as api from '../api';
import {
  button,
  expiry,
  relative,
  field,
  fields,
  fromUtcInput,
  h,
  input,
  replace,
  scroller,
  secretBox,
  select,
  status,
  table,
  td,
  time,
  toUtcInput,
  uid,
} from '../dom';
import { inflightLine, policyTable } from '../limits';

/** Keys per page; each listed key's detail is fetched (the listing has no meta). */
const PAGE = 25;
/** The gateway's cap on `meta` (docs/limits.md), checked here first so nothing invalid is sent. */
const MAX_META_BYTES = 1024;
/** A reroll's grace choices (`grace_s`); the gateway's default, 24 h, is preselected. */
const GRACES: Array<[string, string]> = [
  ['3600', '1 hour'],
  ['86400', '24 hours'],
  ['604800', '7 days'],
];
const PLANS_LIST = 'known-plans';

type Parsed<T> = { ok: true; value: T } | { ok: false; error: string };

/** The metadata field as the PATCH member: null when empty, else a JSON object of at most 1 KiB. */
export function parseMeta(text: string): Parsed<Record<string, unknown> | null> {
  if (!text.trim()) return { ok: true, value: null };
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch (e) {
    return { ok: false, error: `Metadata is not valid JSON: ${e instanceof Error ? e.message : String(e)}. Nothing was sent.` };
  }
  if (v === null || typeof v !== 'object' || Array.isArray(v)) {
    return { ok: false, error: 'Metadata must be a JSON object, e.g. {"customer": "c_42"}. Nothing was sent.' };
  }
  const bytes = new TextEncoder().encode(JSON.stringify(v)).length;
  if (bytes > MAX_META_BYTES) {
    return { ok: false, error: `Metadata is ${bytes} bytes of JSON; at most ${MAX_META_BYTES} (1 KiB). Nothing was sent.` };
  }
  return { ok: true, value: v as Record<string, unknown> };
}

function stateOf(k: api.ApiKey, now = Date.now()): string {
  if (k.revoked_at !== null) return `revoked ${time(k.revoked_at)}`;
  if (k.expires_at !== null && k.expires_at !== undefined && k.expires_at <= now) return 'expired';
  return 'active';
}

const pretty = (v: unknown): string => (v === null || v === undefined ? 'none' : JSON.stringify(v, null, 2));

/** The window "Last used" looks back over (days). */
const ACTIVITY_DAYS = 30;

/** One list row; `show` refreshes its cells from a newer record of the key. */
interface Row {
  key: api.ApiKey;
  lastUsed: HTMLTableCellElement;
  tr: HTMLTableRowElement;
  toggle: HTMLButtonElement;
  show: (k: api.ApiKey) => void;
  showMeta: (text: string) => void;
}

/** The part of a key's detail that its GET answer fills: fields, limits, metadata, overrides. */
function summary(k: api.ApiKeyDetail): HTMLElement {
  const who = `key ${k.prefix}…`;
  return h(
    'div',
    null,
    fields({
      id: k.id,
      project: k.project,
      plan: k.plan,
      name: k.name,
      state: stateOf(k),
      expires: expiry(k.expires_at),
      created: time(k.created_at),
      changed: (k.updated_at ?? 0) > k.created_at ? time(k.updated_at) : 'never',
    }),
    h('h3', null, 'Limits now'),
    policyTable(k.policies, who),
    inflightLine(k.inflight),
    h('h3', null, 'Metadata'),
    h('pre', { class: 'payload', tabindex: 0, 'aria-label': `Metadata of ${who}` }, pretty(k.meta)),
    h('h3', null, 'Overrides'),
    h('pre', { class: 'payload', tabindex: 0, 'aria-label': `Overrides of ${who}` }, pretty(k.overrides)),
  );
}

interface EditForm {
  form: HTMLFormElement;
  /** Sets every field from the key as it now is. */
  sync: (k: api.ApiKeyDetail) => void;
}

/**
 * The edit form. Only the members that differ from what the fields started
 * with are sent (an unchanged expiry already past would be refused), with a
 * new Idempotency-Key per submit; the metadata is checked before anything is.
 */
function editForm(k: api.ApiKeyDetail, saved: (changed: string[]) => Promise<void>, msg: HTMLElement): EditForm {
  const name = input('name', { value: k.name ?? '' });
  const plan = input('plan', { value: k.plan, list: PLANS_LIST, required: true });
  const meta = h('textarea', { name: 'meta', rows: 5, spellcheck: 'false', autocomplete: 'off' });
  const expires = input('expires_at', { type: 'datetime-local', step: 1 });
  const never = h('input', { type: 'checkbox', name: 'never', id: uid('never') });
  const save = h('button', { type: 'submit' }, 'Save changes');
  /** The values the fields started from: what is unchanged is not sent. */
  let base = { name: '', plan: '', meta: '', expires: '', never: true };
  const sync = (r: api.ApiKeyDetail): void => {
    base = {
      name: r.name ?? '',
      plan: r.plan,
      meta: r.meta ? JSON.stringify(r.meta, null, 2) : '',
      expires: r.expires_at ? toUtcInput(r.expires_at) : '',
      never: r.expires_at === null || r.expires_at === undefined,
    };
    name.value = base.name;
    plan.value = base.plan;
    meta.value = base.meta;
    expires.value = base.expires;
    never.checked = base.never;
    expires.disabled = never.checked;
  };
  sync(k);
  never.addEventListener('change', () => {
    expires.disabled = never.checked;
    if (!never.checked && !expires.value) expires.value = toUtcInput(Date.now() + 30 * 86_400_000);
  });

  const fail = (text: string, el?: HTMLElement): void => {
    status(msg, text, 'error');
    el?.setAttribute('aria-invalid', 'true');
    el?.focus();
  };
  const body = (): Parsed<Record<string, unknown>> => {
    const out: Record<string, unknown> = {};
    if (name.value.trim() !== base.name) out.name = name.value.trim() || null;
    if (plan.value.trim() !== base.plan) out.plan = plan.value.trim();
    if (meta.value !== base.meta) {
      const m = parseMeta(meta.value);
      if (!m.ok) return m;
      out.meta = m.value;
    }
    if (never.checked) {
      if (!base.never) out.expires_at = null;
    } else if (base.never || expires.value !== base.expires) {
      const at = fromUtcInput(expires.value);
      if (at === undefined) return { ok: false, error: 'Enter when the key expires (UTC), or tick “Never expires”.' };
      out.expires_at = at;
    }
    return { ok: true, value: out };
  };

  const who = `key ${k.prefix}…`;
  const neverField = h('div', { class: 'field check' }, never, h('label', { for: never.id }, 'Never expires'));
  const metaField = field('Metadata (JSON)', meta, 'A JSON object of at most 1 KiB, forwarded to the origin as X-Postguard-Key-Meta; empty for none.');
  metaField.classList.add('wide');
  const form = h(
    'form',
    { class: 'filters', 'aria-label': `Edit ${who}`, novalidate: true },
    h('h3', null, 'Edit'),
    field('Name', name),
    field('Plan', plan, 'A plan configured on the gateway (an unknown one is refused, naming those there are).'),
    metaField,
    field('Expires (UTC)', expires),
    neverField,
    save,
  );
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    meta.removeAttribute('aria-invalid');
    expires.removeAttribute('aria-invalid');
    const b = body();
    if (!b.ok) {
      fail(b.error, b.error.startsWith('Metadata') ? meta : expires);
      return;
    }
    const changed = Object.keys(b.value);
    if (!changed.length) {
      status(msg, 'Nothing changed.');
      return;
    }
    save.disabled = true;
    status(msg, 'Saving…');
    api
      .call<api.ApiKey>('PATCH', `/keys/${encodeURIComponent(k.id)}`, { body: b.value, idempotencyKey: api.newIdempotencyKey() })
      .then(
        () => saved(changed).catch((e) => status(msg, `Saved; showing the key again failed: ${api.describe(e)}`, 'error')),
        (e) => fail(api.describe(e)),
      )
      .finally(() => (save.disabled = false));
  });
  return { form, sync };
}

/** Reroll with a confirm step and a grace choice; the new secret is shown once. */
function rerollBox(k: api.ApiKeyDetail, done: () => Promise<void>, msg: HTMLElement): HTMLElement {
  const who = `key ${k.prefix}…`;
  const once = h('div', { class: 'once' });
  const box = h('div', { class: 'row' });
  const start = (): void => {
    const grace = select('grace_s', GRACES, '86400');
    const confirm = h('button', { type: 'submit', class: 'danger', 'aria-label': `Confirm reroll of ${who}` }, 'Confirm reroll');
    const cancel = button('Cancel', () => {
      replace(box, first);
      first.focus();
    }, { 'aria-label': `Cancel rerolling ${who}` });
    const form = h(
      'form',
      { class: 'row', 'aria-label': `Reroll ${who}`, novalidate: true },
      field('The current secret keeps working for', grace, 'Both secrets work until then; afterwards only the new one.'),
      confirm,
      cancel,
    );
    form.addEventListener('submit', (ev) => {
      ev.preventDefault();
      confirm.disabled = true;
      status(msg, 'Rerolling…');
      api
        .call<api.RerolledApiKey>('POST', `/keys/${encodeURIComponent(k.id)}/reroll`, {
          body: { grace_s: Number(grace.value) },
          idempotencyKey: api.newIdempotencyKey(),
        })
        .then((r) => {
          replace(
            once,
            secretBox(`New API key ${r.prefix}… for ${r.project}`, r.key),
            h('p', { class: 'previous-until' }, `The previous secret works until ${expiry(r.previous_expires_at)}.`),
          );
          replace(box, first);
          once.querySelector('button')?.focus();
          return done().then(() => status(msg, `Key ${r.prefix}… rerolled.`, 'ok'));
        })
        .catch((e) => {
          confirm.disabled = false;
          status(msg, api.describe(e), 'error');
        });
    });
    replace(box, form);
    grace.focus();
  };
  const first = button('Reroll', start, { 'aria-label': `Reroll ${who}` });
  box.append(first);
  return h(
    'div',
    null,
    h('h3', null, 'Reroll'),
    h('p', { class: 'hint' }, 'A new secret for the same key: its id, prefix, counters and audit log stay.'),
    box,
    once,
  );
}

/** A key's detail, from GET /keys/{id}: what fills the panel. Edits and rerolls refresh it and its row. */
async function detail(id: string, row: Row): Promise<{ title: HTMLElement; nodes: Array<HTMLElement | null> }> {
  let k = await api.call<api.ApiKeyDetail>('GET', `/keys/${encodeURIComponent(id)}`);
  const msg = h('p', { class: 'status' });
  const facts = h('div', null, summary(k));
  const refresh = async (): Promise<void> => {
    k = await api.call<api.ApiKeyDetail>('GET', `/keys/${encodeURIComponent(id)}`);
    replace(facts, summary(k));
    row.show(k);
    row.showMeta(k.meta ? 'yes' : 'no');
  };
  const live = k.revoked_at === null;
  const edit = live
    ? editForm(
        k,
        async (changed) => {
          await refresh();
          edit?.sync(k);
          status(msg, `Key ${k.prefix}… saved (${changed.join(', ')}); it applies from the key’s next request.`, 'ok');
        },
        msg,
      )
    : null;
  row.showMeta(k.meta ? 'yes' : 'no');
  const title = h('h2', { id: uid('key-title'), tabindex: -1 }, `Key ${k.prefix}… of ${k.project}`);
  return {
    title,
    nodes: [facts, edit?.form ?? null, live ? rerollBox(k, refresh, msg) : h('p', null, 'A revoked key cannot be changed or rerolled.'), msg],
  };
}

export async function keys(main: HTMLElement): Promise<void> {
  const msg = h('p', { class: 'status' });
  const once = h('div', { class: 'once' });
  const list = h('div');
  const pager = h('div', { class: 'row pager' });
  const plans = h('datalist', { id: PLANS_LIST });
  const panel = h('section', { class: 'key-detail', id: uid('key-detail'), hidden: true });
  const onError = (e: unknown): void => status(msg, api.describe(e), 'error');

  const project = input('project', { required: true, placeholder: 'acme' });
  const plan = input('plan', { value: 'trial', list: PLANS_LIST });
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
      .call<api.CreatedApiKey>('POST', '/keys', { body })
      .then((k) => {
        replace(once, secretBox(`API key ${k.prefix}… for ${k.project}`, k.key));
        return load().then(() => status(msg, `Key ${k.id} created.`, 'ok'));
      })
      .catch(onError);
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
      .catch(onError);
  });

  /** Bumped by every load, so an older page's lookups stop. */
  /** Bumped by every Details click: only the latest one fills the panel. */
  let opening = 0;
  let rows: Row[] = [];

  const makeRow = (k: api.ApiKey): Row => {
    const planCell = td();
    const nameCell = td();
    const expiresCell = h('td', { class: 'expires' });
    const metaCell = h('td', { class: 'meta' }, k.has_meta ? 'yes' : 'no');
    const stateCell = td();
    const lastUsed = h('td', { class: 'last-used' }, '…');
    const actions = h('td', { class: 'actions' });
    const show = (r: api.ApiKey): void => {
      planCell.textContent = r.plan;
      nameCell.textContent = r.name ?? '';
      expiresCell.textContent = expiry(r.expires_at);
      stateCell.textContent = stateOf(r);
    };
    show(k);
    const toggle = button('Details', () => {
      const open = toggle.getAttribute('aria-expanded') === 'true';
      for (const r of rows) r.toggle.setAttribute('aria-expanded', 'false');
      if (open) {
        panel.hidden = true;
        return;
      }
      toggle.setAttribute('aria-expanded', 'true');
      const mine = ++opening;
      replace(panel, h('p', null, 'Loading…'));
      panel.removeAttribute('aria-labelledby');
      panel.hidden = false;
      detail(k.id, row)
        .then(({ title, nodes }) => {
          if (mine !== opening) return;
          replace(panel, title, ...nodes);
          panel.setAttribute('aria-labelledby', title.id);
          panel.scrollIntoView({ block: 'start' });
          title.focus();
        })
        .catch(onError);
    }, { 'aria-expanded': 'false', 'aria-controls': panel.id, 'aria-label': `Details of key ${k.prefix}` });
    actions.append(toggle, h('a', { href: `#statistics?key_prefix=${encodeURIComponent(k.prefix)}`, 'aria-label': `Statistics of key ${k.prefix}` }, 'Statistics'));
    if (k.revoked_at === null) {
      actions.append(
        button('Revoke', () => {
          api
            .call('DELETE', `/keys/${encodeURIComponent(k.id)}`)
            .then(() => load())
            .then(() => status(msg, `Key ${k.prefix}… revoked.`, 'ok'))
            .catch(onError);
        }, { class: 'danger', 'aria-label': `Revoke key ${k.prefix}` }),
      );
    }
    const tr = h(
      'tr',
      { 'data-key-id': k.id },
      td(h('code', null, `${k.prefix}…`)),
      td(k.project),
      planCell,
      nameCell,
      expiresCell,
      metaCell,
      td(time(k.created_at)),
      stateCell,
      lastUsed,
      actions,
    );
    const row: Row = { key: k, lastUsed, tr, toggle, show, showMeta: (text) => (metaCell.textContent = text) };
    return row;
  };

  /** Fills each row's "Last used" from its project's key activity. */
  const showLastUsed = async (these: Row[]): Promise<void> => {
    const projects = [...new Set(these.map((r) => r.key.project))];
    await Promise.all(
      projects.map(async (p) => {
        const act = await api.call<{ data: api.KeyActivity[] }>('GET', '/keys/activity', { query: { project: p, days: ACTIVITY_DAYS } });
        for (const r of these.filter((x) => x.key.project === p)) {
          const a = act.data.find((x) => x.key_prefix === r.key.prefix);
          if (a) {
            replace(r.lastUsed, h('span', { class: 'nowrap', title: time(a.last_used_at) }, relative(a.last_used_at)), h('small', { class: 'hint' }, ` ${a.requests} requests`));
            r.lastUsed.dataset.lastUsedAt = String(a.last_used_at);
          } else {
            replace(r.lastUsed, `not in ${ACTIVITY_DAYS} days`);
          }
        }
      }),
    );
  };

  const load = async (cursor?: string): Promise<void> => {
    const page = await api.call<api.Page<api.ApiKey>>('GET', '/keys', { query: { limit: PAGE, cursor } });
    replace(plans, ...[...new Set(page.data.map((k) => k.plan))].sort().map((p) => h('option', { value: p })));
    panel.hidden = true;
    replace(pager);
    if (cursor) pager.append(button('Newest', () => load().catch(onError)));
    if (page.next_cursor) {
      const older = page.next_cursor;
      pager.append(button('Older', () => load(older).catch(onError)));
    }
    if (!page.data.length) {
      rows = [];
      replace(list, h('p', null, 'No keys yet.'));
      return;
    }
    rows = page.data.map(makeRow);
    replace(
      list,
      scroller(
        'API keys',
        table('API keys', ['Prefix', 'Project', 'Plan', 'Name', 'Expires (UTC)', 'Meta', 'Created (UTC)', 'State', 'Last used', 'Actions'], rows.map((r) => r.tr)),
      ),
    );
    const shown = rows;
    showLastUsed(shown).catch((e) => {
      for (const r of shown) replace(r.lastUsed, '—');
      onError(e);
    });
  };

  main.append(create, portal, plans, msg, once, h('h2', null, 'API keys'), list, pager, panel);
  await load();
}
