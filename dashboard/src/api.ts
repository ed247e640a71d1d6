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

export function describe(e: unknown): string {
  return e instanceof ApiError ? e.describe() : e instanceof Error ? e.message : String(e);
}

// The resources (CONTRACT §10 "Resources").
export interface Me {
  prefix: string;
  project: string;
  plan: string;
  limit: number;
  remaining: number;
  reset: number;
  window_s: number;
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
  key?: string;
}
