// Calls to the gateway's own API with the signed-in credential. The credential
// lives only in sessionStorage (this tab, until it closes): never in a URL, a
// cookie or localStorage.

import type * as sdk from '../../clients/typescript/src/types';

export const API = '/_postguard/v1';

export type Kind = 'operator' | 'key' | 'session';

export interface Credential {
  kind: Kind;
  token: string;
  /** The project (key and session); none for the operator. */
  project?: string;
  /** Epoch ms when a session ends. */
  expires_at?: number;
  prefix?: string;
}

const STORE = 'postguard.credential';

export function load(): Credential | null {
  try {
    const raw = sessionStorage.getItem(STORE);
    if (!raw) return null;
    const c = JSON.parse(raw) as Credential;
    if (c.kind === 'session' && c.expires_at !== undefined && c.expires_at <= Date.now()) {
      sessionStorage.removeItem(STORE);
      return null;
    }
    return typeof c.token === 'string' ? c : null;
  } catch {
    return null;
  }
}

export function save(c: Credential): void {
  sessionStorage.setItem(STORE, JSON.stringify(c));
}

export function forget(): void {
  sessionStorage.removeItem(STORE);
}

/** A problem+json answer (or a network failure) as an error. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    readonly detail: string,
    readonly requestId?: string,
  ) {
    super(`${code}: ${detail}`);
  }

  describe(): string {
    const rid = this.requestId ? ` (request ${this.requestId})` : '';
    return `${this.status ? `${this.status} ` : ''}${this.code}: ${this.detail}${rid}`;
  }
}

type Query = Record<string, string | number | undefined | null>;

export interface CallOptions {
  query?: Query;
  body?: unknown;
  /** Another credential than the signed-in one (sign-in checks), or null for none. */
  token?: string | null;
  /**
   * Sent as `Idempotency-Key` (docs/idempotency.md): a new one per submit of a
   * mutating form (`newIdempotencyKey()`); the gateway runs a submit at most
   * once and answers a repeat of it with the stored answer.
   */
  idempotencyKey?: string;
}

let current: Credential | null = null;
let onUnauthorized: () => void = () => {};

export function use(c: Credential | null, unauthorized?: () => void): void {
  current = c;
  if (unauthorized) onUnauthorized = unauthorized;
}

export function credential(): Credential | null {
  return current;
}

export async function call<T>(method: string, path: string, opts: CallOptions = {}): Promise<T> {
  const url = new URL(API + path, location.origin);
  for (const [k, v] of Object.entries(opts.query ?? {})) {
    if (v !== undefined && v !== null && v !== '') url.searchParams.set(k, String(v));
  }
  const headers: Record<string, string> = { accept: 'application/json' };
  const token = opts.token === undefined ? current?.token : opts.token;
  if (token) headers.authorization = `Bearer ${token}`;
  if (opts.idempotencyKey) headers['idempotency-key'] = opts.idempotencyKey;
  let body: string | undefined;
  if (opts.body !== undefined) {
    body = JSON.stringify(opts.body);
    headers['content-type'] = 'application/json';
  }
  let res: Response;
  try {
    res = await fetch(url, { method, headers, body, credentials: 'omit', cache: 'no-store' });
  } catch (e) {
    throw new ApiError(0, 'NETWORK_ERROR', e instanceof Error ? e.message : String(e));
  }
  const text = await res.text();
  let json: unknown;
  try {
    json = text ? JSON.parse(text) : undefined;
  } catch {
    json = undefined;
  }
  if (!res.ok) {
    const p = (json ?? {}) as { code?: string; detail?: string; request_id?: string };
    const err = new ApiError(res.status, p.code ?? 'HTTP_ERROR', p.detail ?? res.statusText, p.request_id);
    if (res.status === 401 && opts.token === undefined) onUnauthorized();
    throw err;
  }
  return json as T;
}

/**
 * A fresh Idempotency-Key (a random UUID). `crypto.randomUUID` exists only in
 * secure contexts; a gateway reached over plain http elsewhere than localhost
 * still gets 122 random bits from `getRandomValues`, which exists everywhere.
 */
export function newIdempotencyKey(): string {
  if (typeof crypto.randomUUID === 'function') return crypto.randomUUID();
  const b = crypto.getRandomValues(new Uint8Array(16));
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  const hex = Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

export function describe(e: unknown): string {
  return e instanceof ApiError ? e.describe() : e instanceof Error ? e.message : String(e);
}

// The resources: the TypeScript SDK's types, the one declaration of the API's shapes
// (a change there that the dashboard does not follow fails its type check).
export type {
  ApiKey,
  ApiKeyDetail,
  AuditRow,
  CreatedApiKey,
  CreatedSubscription,
  DeliveryAttempt,
  DeliveryStatus,
  Inflight,
  KeyActivity,
  Me,
  Page,
  PolicyState,
  RerolledApiKey,
  Stats,
  Subscription,
  SubscriptionHealth,
  Task,
  TestResult,
  Usage,
} from '../../clients/typescript/src/types';

/**
 * Ordering keys (ADR 0043): a delivery's lane and the delivery before it that it waits for.
 * Optional until the SDK's types declare them (then these intersections change nothing).
 */
export interface Ordered {
  ordering_key?: string | null;
  /** The delivery before this one in its lane while this one waits for it; null otherwise. */
  blocked_by?: string | null;
}
export type Delivery = sdk.Delivery & Ordered;
export type DeliveryDetail = sdk.DeliveryDetail & Ordered;
export type EventRow = sdk.EventRow & Pick<Ordered, 'ordering_key'>;
