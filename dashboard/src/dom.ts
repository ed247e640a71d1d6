// Building the page from DOM APIs only. Every string that reaches the page goes
// through a text node or an attribute value: nothing here parses HTML, and the
// page's Content-Security-Policy (require-trusted-types-for 'script') makes any
// innerHTML assignment throw, so data from outside can never become markup.

export type Child = Node | string | number | null | undefined | false;

export interface Props {
  /** Attributes, set with setAttribute (event-handler attributes are refused). */
  [attr: string]: string | number | boolean | undefined | ((ev: Event) => void) | Record<string, (ev: Event) => void>;
}

export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  props: Props | null = null,
  ...children: Child[]
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(props ?? {})) {
    if (value === undefined || value === false) continue;
    if (name === 'on' && typeof value === 'object') {
      for (const [ev, fn] of Object.entries(value)) el.addEventListener(ev, fn);
      continue;
    }
    if (typeof value === 'function' || typeof value === 'object') continue;
    if (/^on/i.test(name)) throw new Error(`refusing event-handler attribute ${name}`);
    el.setAttribute(name, value === true ? '' : String(value));
  }
  append(el, ...children);
  return el;
}

export function append(el: Node, ...children: Child[]): void {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    el.appendChild(typeof c === 'string' || typeof c === 'number' ? document.createTextNode(String(c)) : c);
  }
}

/** Replaces every child of `el`. */
export function replace(el: Element, ...children: Child[]): void {
  el.replaceChildren();
  append(el, ...children);
}

let seq = 0;
/** A unique element id (for label/aria wiring). */
export function uid(prefix: string): string {
  seq += 1;
  return `${prefix}-${seq}`;
}

/** A labelled form field. */
export function field(
  label: string,
  input: HTMLInputElement | HTMLSelectElement | HTMLTextAreaElement,
  hint?: string,
): HTMLDivElement {
  const id = input.id || uid('f');
  input.id = id;
  const wrap = h('div', { class: 'field' }, h('label', { for: id }, label), input);
  if (hint) {
    const hid = `${id}-hint`;
    input.setAttribute('aria-describedby', hid);
    wrap.append(h('small', { id: hid, class: 'hint' }, hint));
  }
  return wrap;
}

export function input(name: string, props: Props = {}): HTMLInputElement {
  return h('input', { name, type: 'text', autocomplete: 'off', ...props });
}

export function select(name: string, options: Array<[string, string]>, value = ''): HTMLSelectElement {
  const s = h('select', { name });
  for (const [v, text] of options) {
    const o = h('option', { value: v }, text);
    if (v === value) o.selected = true;
    s.append(o);
  }
  return s;
}

export function button(text: string, onClick: (ev: Event) => void, props: Props = {}): HTMLButtonElement {
  return h('button', { type: 'button', ...props, on: { click: onClick } }, text);
}

/** A horizontally scrollable, keyboard-focusable region for wide tables. */
export function scroller(label: string, table: HTMLTableElement): HTMLDivElement {
  return h('div', { class: 'scroll', role: 'region', 'aria-label': label, tabindex: 0 }, table);
}

export function table(caption: string, headers: string[], rows: HTMLTableRowElement[]): HTMLTableElement {
  return h(
    'table',
    null,
    h('caption', { class: 'visually-hidden' }, caption),
    h('thead', null, h('tr', null, ...headers.map((t) => h('th', { scope: 'col' }, t)))),
    h('tbody', null, ...rows),
  );
}

export function td(...children: Child[]): HTMLTableCellElement {
  return h('td', null, ...children);
}

/** A definition list of every field of a record, values as text. */
export function fields(record: Record<string, unknown>): HTMLDListElement {
  const dl = h('dl', { class: 'fields' });
  for (const [k, v] of Object.entries(record)) {
    dl.append(h('dt', null, k), h('dd', null, show(v)));
  }
  return dl;
}

/** How any value is shown: as text, never as markup. */
export function show(v: unknown): string {
  if (v === null || v === undefined) return '—';
  if (typeof v === 'string') return v;
  if (typeof v === 'number' || typeof v === 'boolean') return String(v);
  return JSON.stringify(v);
}

export function time(ms: number | null | undefined): string {
  if (ms === null || ms === undefined) return '—';
  return new Date(ms).toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z');
}

/** A polite status line; `kind` "error" makes it an alert. */
export function status(el: HTMLElement, text: string, kind: 'info' | 'error' | 'ok' = 'info'): void {
  el.className = `status ${kind}`;
  el.setAttribute('role', kind === 'error' ? 'alert' : 'status');
  el.textContent = text;
}

/** A secret shown once, with a copy button. */
export function secretBox(label: string, value: string): HTMLDivElement {
  const id = uid('secret');
  const out = h('output', { id, class: 'secret-value' }, value);
  const note = h('span', { class: 'copied', role: 'status' });
  const copy = button(
    `Copy ${label.toLowerCase()}`,
    () => {
      navigator.clipboard
        .writeText(value)
        .then(() => (note.textContent = 'Copied'))
        .catch(() => (note.textContent = 'Copy failed: select the text and copy it'));
    },
    { 'aria-controls': id },
  );
  return h(
    'div',
    { class: 'secret', role: 'group', 'aria-label': label },
    h('p', null, h('strong', null, `${label} (shown once — store it now): `)),
    out,
    h('div', { class: 'row' }, copy, note),
  );
}

const RELATIVE = new Intl.RelativeTimeFormat('en', { numeric: 'always' });

/** How far `ms` is from `now` in words: "in 3 days", "in 1 hour", "5 minutes ago". */
export function relative(ms: number, now = Date.now()): string {
  const d = ms - now;
  const a = Math.abs(d);
  const [n, unit]: [number, Intl.RelativeTimeFormatUnit] =
    a < 45_000
      ? [d / 1000, 'second']
      : a < 45 * 60_000
        ? [d / 60_000, 'minute']
        : a < 36 * 3_600_000
          ? [d / 3_600_000, 'hour']
          : [d / 86_400_000, 'day'];
  return RELATIVE.format(Math.round(n), unit);
}

/** A key's expiry as the views show it: "never", "expired (…)", or the date and how far. */
export function expiry(ms: number | null | undefined, now = Date.now()): string {
  if (ms === null || ms === undefined) return 'never';
  if (ms <= now) return `expired (${time(ms)})`;
  return `${time(ms)} (${relative(ms, now)})`;
}

/** A datetime-local input's value, read as UTC, in epoch ms (undefined when empty or invalid). */
export function fromUtcInput(v: string): number | undefined {
  if (!v) return undefined;
  const ms = Date.parse(`${v}Z`);
  return Number.isNaN(ms) ? undefined : ms;
}

/** Epoch ms as a datetime-local value in UTC, to the second. */
export function toUtcInput(ms: number): string {
  return new Date(ms).toISOString().slice(0, 19);
}

/**
 * A small bar of `value` out of `max`: a native <meter> (no inline style, which
 * the CSP forbids), named for assistive technology. `goodWhen` says which end is
 * healthy, so the browser colours a nearly spent budget (or a nearly full quota).
 */
export function meter(label: string, value: number, max: number, goodWhen: 'high' | 'low'): HTMLMeterElement {
  const top = Math.max(max, 1);
  return h('meter', {
    min: 0,
    max: top,
    value: Math.min(Math.max(value, 0), top),
    low: top * 0.2,
    high: top * 0.8,
    optimum: goodWhen === 'high' ? top : 0,
    'aria-label': label,
  });
}

/**
 * An identifier (request id, delivery id…) that never wraps: shown on one line,
 * cut with an ellipsis by the stylesheet when its cell is narrow, whole on focus
 * or hover (`title`), and whole when selected and copied (the text is all there).
 */
export function ident(value: string | null | undefined, label?: string): HTMLElement | string {
  if (value === null || value === undefined || value === '') return '—';
  return h('code', { class: 'id', tabindex: 0, title: value, 'aria-label': label ? `${label} ${value}` : undefined }, value);
}

/** A UTC time that never wraps (`time`). */
export function when(ms: number | null | undefined): HTMLElement | string {
  if (ms === null || ms === undefined) return '—';
  return h('span', { class: 'nowrap' }, time(ms));
}

const GATEWAY_KEY = 'postguard.include_gateway';

/**
 * The "Include gateway calls" box of Statistics and the Audit log: unticked by
 * default (the gateway's own calls — the dashboard's reads among them — are left
 * out, `include_gateway=false`); the choice holds for this tab (sessionStorage;
 * it is no credential).
 */
export function gatewayToggle(onChange: (include: boolean) => void): { box: HTMLDivElement; include: () => boolean } {
  const cb = h('input', { type: 'checkbox', name: 'include_gateway', id: uid('gw') });
  cb.checked = sessionStorage.getItem(GATEWAY_KEY) === 'true';
  cb.addEventListener('change', () => {
    sessionStorage.setItem(GATEWAY_KEY, String(cb.checked));
    onChange(cb.checked);
  });
  const hint = h('small', { id: `${cb.id}-hint`, class: 'hint' }, 'The gateway’s own API under /_postguard/, the dashboard’s reads included.');
  cb.setAttribute('aria-describedby', hint.id);
  const box = h('div', { class: 'field check gateway-toggle' }, cb, h('label', { for: cb.id }, 'Include gateway calls'), hint);
  return { box, include: () => cb.checked };
}

const PROJECT_KEY = 'postguard.project';

/**
 * The operator's project field of the views whose records belong to a project
 * (Webhooks, Deliveries, Events): prefilled from `?project=` in the address's
 * fragment or the last one chosen in this tab.
 */
export function projectField(): HTMLInputElement {
  const params = new URLSearchParams(location.hash.split('?')[1] ?? '');
  const value = params.get('project') ?? sessionStorage.getItem(PROJECT_KEY) ?? '';
  const f = input('project', { value, placeholder: 'demo', required: true, pattern: '[A-Za-z0-9._\\-]{1,64}' });
  f.addEventListener('input', () => sessionStorage.setItem(PROJECT_KEY, f.value.trim()));
  return f;
}

/** The fragment's query (`#deliveries?subscription_id=…`). */
export function hashParams(): URLSearchParams {
  return new URLSearchParams(location.hash.split('?')[1] ?? '');
}

/** A definition list of header names and values, as text. */
export function headerList(label: string, headers: Record<string, string> | null | undefined): HTMLElement {
  if (!headers) return h('p', { class: 'hint' }, `${label}: not recorded (an attempt from before gateway 0.4, or none sent).`);
  const dl = h('dl', { class: 'fields headers', 'aria-label': label });
  for (const [k, v] of Object.entries(headers)) dl.append(h('dt', null, k), h('dd', null, v));
  return dl;
}
