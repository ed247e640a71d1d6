// Calls to the gateway's own API with the signed-in credential. The credential
// lives only in sessionStorage (this tab, until it closes): never in a URL, a
// cookie or localStorage.

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

// The resources (docs/api-reference.md "Resources", §13).

/** One named policy's state now (`reset`: epoch seconds). */
export interface PolicyState {
  name: string;
  limit: number;
  remaining: number;
  reset: number;
  window_s: number;
}

/** The concurrency quota: requests of the key in flight at the origin. */
export interface Inflight {
  limit: number;
  in_use: number;
}

export interface Me {
  prefix: string;
  project: string;
  plan: string;
  /** `limit`…`window_s`: the binding policy. */
  limit: number;
  remaining: number;
  reset: number;
  window_s: number;
  /** Epoch ms; null: never. */
  expires_at?: number | null;
  policies?: PolicyState[];
  inflight?: Inflight;
}

export interface Page<T> {
  data: T[];
  next_cursor: string | null;
}

export interface AuditRow {
  request_id: string;
  time: number;
  method: string;
  path: string;
  status: number;
  response_bytes: number | null;
  response_time_ms: number;
  client_ip: string | null;
  user_agent: string | null;
  key_prefix: string | null;
  project: string | null;
  idempotency_key: string | null;
  replayed: boolean;
  rate_limit_remaining: number | null;
}

export interface Stats {
  days: Array<{ date: string; requests: number; errors: number; server_errors: number }>;
  top_paths: Array<{ path: string; requests: number }>;
  error_share: number;
  p50_ms: number | null;
  p95_ms: number | null;
}

export interface Subscription {
  id: string;
  url: string;
  events: string[];
  description: string | null;
  created_at: number;
  state?: 'active' | 'paused' | 'disabled';
  disabled_reason?: string;
  disabled_at?: number;
  rate_limit_per_s?: number | null;
  secret?: string;
}

export interface PingResult {
  status_code: number | null;
  duration_ms: number;
  response_excerpt: string | null;
  error: string | null;
}

export interface Task {
  id: string;
  kind: string;
  state: 'queued' | 'running' | 'done' | 'failed';
  total: number;
  done: number;
  failed: number;
}

export interface Delivery {
  id: string;
  event_id: string;
  event_type: string;
  subscription_id: string;
  url: string;
  status: string;
  attempts_made: number;
  next_attempt_at: number | null;
  created_at: number;
}

export interface Attempt {
  attempt: number;
  url: string;
  status_code: number | null;
  error: string | null;
  response_excerpt: string | null;
  duration_ms: number;
  request_id: string;
  at: number;
  next_retry_at: number | null;
}

export interface DeliveryDetail extends Delivery {
  attempts: Attempt[];
  payload?: unknown;
}

export interface KeyRecord {
  id: string;
  prefix: string;
  project: string;
  plan: string;
  name: string | null;
  created_at: number;
  revoked_at: number | null;
  /** Epoch ms; null: never. */
  expires_at?: number | null;
  /** null in the listing; `GET /keys/{id}` has it. */
  meta?: Record<string, unknown> | null;
  overrides?: Record<string, unknown> | null;
  updated_at?: number;
  key?: string;
  /** The listing's: whether the key has metadata / overrides. */
  has_meta?: boolean;
  has_overrides?: boolean;
}

/** `GET /keys/{id}`: the key with its meta, overrides and each policy's state. */
export interface KeyDetail extends KeyRecord {
  policies: PolicyState[];
  inflight?: Inflight;
}

/** `POST /keys/{id}/reroll`: the new secret (shown once) and the old one's end. */
export interface Rerolled extends KeyRecord {
  key: string;
  previous_expires_at: number;
}
