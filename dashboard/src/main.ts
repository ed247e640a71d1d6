// The dashboard's shell: sign-in (portal link, API key or operator token),
// navigation between the views, and who is signed in.

import * as api from './api';
import { button, field, h, input, replace, status } from './dom';
import { statistics } from './views/statistics';
import { audit } from './views/audit';
import { webhooks } from './views/webhooks';
import { deliveries } from './views/deliveries';
import { events } from './views/events';
import { keys } from './views/keys';
import { operations } from './views/operations';
import { usage } from './views/usage';

type View = (main: HTMLElement) => void | Promise<void>;

interface Route {
  hash: string;
  name: string;
  view: View;
  operatorOnly?: boolean;
  projectOnly?: boolean;
}

const ROUTES: Route[] = [
  { hash: 'statistics', name: 'Statistics', view: statistics },
  { hash: 'usage', name: 'Usage', view: usage },
  { hash: 'audit', name: 'Audit log', view: audit },
  // A project's webhooks: the operator reads them for the project it names.
  { hash: 'webhooks', name: 'Webhooks', view: webhooks },
  { hash: 'deliveries', name: 'Deliveries', view: deliveries },
  { hash: 'events', name: 'Events', view: events },
  { hash: 'operations', name: 'Operations', view: operations, projectOnly: true },
  { hash: 'keys', name: 'Keys', view: keys, operatorOnly: true },
];

const $ = (id: string): HTMLElement => {
  const el = document.getElementById(id);
  if (!el) throw new Error(`#${id} missing`);
  return el;
};

function visible(r: Route, c: api.Credential): boolean {
  if (r.operatorOnly) return c.kind === 'operator';
  if (r.projectOnly) return c.kind !== 'operator';
  return true;
}

function currentRoute(c: api.Credential): Route {
  const hash = location.hash.replace(/^#/, '').split('?')[0];
  return ROUTES.find((r) => r.hash === hash && visible(r, c)) ?? ROUTES[0];
}

function whoText(c: api.Credential): string {
  if (c.kind === 'operator') return 'Operator (every project)';
  if (c.kind === 'key') return `Project ${c.project} — API key ${c.prefix}…`;
  const until = c.expires_at ? new Date(c.expires_at).toLocaleTimeString() : '';
  return `Project ${c.project} — portal session until ${until}`;
}

function signOut(): void {
  api.forget();
  api.use(null);
  history.replaceState(null, '', location.pathname);
  void render();
}

async function render(): Promise<void> {
  const main = $('main');
  const nav = $('nav');
  const who = $('who');
  const c = api.credential();
  if (!c) {
    replace(nav);
    replace(who);
    signIn(main);
    return;
  }
  replace(who, h('span', null, whoText(c)), button('Sign out', signOut));
  const route = currentRoute(c);
  document.title = `${route.name} — postguard`;
  replace(
    nav,
    h(
      'ul',
      null,
      ...ROUTES.filter((r) => visible(r, c)).map((r) =>
        h('li', null, h('a', { href: `#${r.hash}`, 'aria-current': r === route ? 'page' : undefined }, r.name)),
      ),
    ),
  );
  replace(main, h('h1', null, route.name));
  try {
    await route.view(main);
  } catch (e) {
    const p = h('p');
    status(p, api.describe(e), 'error');
    main.append(p);
  }
}

/**
 * Works out what a pasted token is from its published shape (API keys start
 * pgk_, sessions pgs_; anything else can only be the operator token), then
 * checks it with one call that credential may make.
 */
async function identify(token: string): Promise<api.Credential> {
  if (token.startsWith('pgk_')) {
    const me = await api.call<api.Me>('GET', '/me', { token });
    return { kind: 'key', token, project: me.project, prefix: me.prefix };
  }
  if (token.startsWith('pgs_')) {
    const me = await api.call<{ project: string; expires_at: number }>('GET', '/me', { token });
    return { kind: 'session', token, project: me.project, expires_at: me.expires_at };
  }
  await api.call('GET', '/keys', { token, query: { limit: 1 } });
  return { kind: 'operator', token };
}

function signIn(main: HTMLElement): void {
  document.title = 'Sign in — postguard';
  const token = input('token', { type: 'password', required: true, autocomplete: 'off', spellcheck: 'false' });
  const msg = h('p', { class: 'status' });
  const form = h(
    'form',
    { 'aria-labelledby': 'signin-title', novalidate: true },
    field('API key or operator token', token, 'Integrators: open the portal link you were given, or paste an API key.'),
    h('button', { type: 'submit' }, 'Sign in'),
    msg,
  );
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const value = token.value.trim();
    if (!value) {
      status(msg, 'Enter an API key or the operator token.', 'error');
      return;
    }
    status(msg, 'Signing in…');
    identify(value)
      .then((c) => {
        api.save(c);
        api.use(c);
        location.hash = '#statistics';
        return render();
      })
      .catch((e) => status(msg, `Sign-in failed: ${api.describe(e)}`, 'error'));
  });
  replace(main, h('h1', { id: 'signin-title' }, 'Sign in'), form);
}

/**
 * A portal link carries its token in the fragment (#portal=…), which is never
 * sent to a server. It is exchanged once for a session, then removed from the
 * address bar and the history entry before anything else runs.
 */
async function redeemPortalLink(): Promise<string | null> {
  const m = /^#portal=([A-Za-z0-9_.-]+)$/.exec(location.hash);
  if (!m) return null;
  history.replaceState(null, '', `${location.pathname}#statistics`);
  try {
    const s = await api.call<{ session: string; project: string; expires_at: number }>('POST', '/portal-sessions', {
      token: null,
      body: { token: m[1] },
    });
    const c: api.Credential = { kind: 'session', token: s.session, project: s.project, expires_at: s.expires_at };
    api.save(c);
    api.use(c);
    return null;
  } catch (e) {
    return `This portal link cannot be used: ${api.describe(e)}. Ask for a new link.`;
  }
}

async function start(): Promise<void> {
  const failure = await redeemPortalLink();
  const c = api.credential() ?? api.load();
  api.use(c, () => {
    // A 401 with the stored credential: it expired or was revoked.
    api.forget();
    api.use(null);
    void render().then(() => {
      const p = h('p');
      status(p, 'You were signed out: the credential is no longer accepted (expired or revoked).', 'error');
      $('main').append(p);
    });
  });
  window.addEventListener('hashchange', () => void render());
  await render();
  if (failure) {
    const p = h('p');
    status(p, failure, 'error');
    $('main').append(p);
  }
}

void start();
