// Resource shapes of the gateway's own API (postguard CONTRACT §10, §11, §12). Timestamps are
// epoch milliseconds unless said otherwise.

export interface Page<T> {
  data: T[];
  next_cursor: string | null;
}

export interface PageQuery {
  limit?: number;
  cursor?: string;
}

export interface Me {
  prefix: string;
  project: string;
  plan: string;
  limit: number;
  remaining: number;
  /** Epoch seconds. */
  reset: number;
  window_s: number;
}

export interface ApiKey {
  id: string;
  prefix: string;
  project: string;
  plan: string;
  name: string | null;
  created_at: number;
  revoked_at: number | null;
}

/** Returned once, on creation: `key` is never shown again. */
export interface CreatedApiKey extends ApiKey {
  key: string;
}

export interface Subscription {
  id: string;
  url: string;
  events: string[];
  description: string | null;
  created_at: number;
  state?: 'active' | 'paused' | 'disabled';
  disabled_reason?: string | null;
  disabled_at?: number | null;
  rate_limit_per_s?: number | null;
}

/** Returned on creation: `secret` (`whsec_…`) is shown once. */
export interface CreatedSubscription extends Subscription {
  secret: string;
}

export interface SubscriptionInput {
  url: string;
  events: string[];
  description?: string;
  rate_limit_per_s?: number;
}

export type DeliveryStatus = 'pending' | 'delivered' | 'failed' | 'dead_letter' | 'paused';

export interface Delivery {
  id: string;
  event_id: string;
  event_type: string;
  subscription_id: string;
  url: string;
  status: DeliveryStatus;
  attempts_made: number;
  next_attempt_at: number | null;
  created_at: number;
}

export interface DeliveryAttempt {
  attempt: number;
  url: string;
  status_code: number | null;
  error: string | null;
  response_excerpt: string | null;
  duration_ms: number;
  request_id: string;
  at: number;
}

export interface DeliveryDetail extends Delivery {
  attempts: DeliveryAttempt[];
}

export interface DeliveryQuery extends PageQuery {
  status?: DeliveryStatus;
  event_type?: string;
  since?: number | string;
}

export interface PublishInput {
  project: string;
  type: string;
  data: unknown;
  /** The event id; generated (`evt_…`) when absent so that a retried publish is a no-op. */
  id?: string;
}

export interface EventRow {
  id: string;
  type: string;
  timestamp: number | string;
  data: unknown;
  request_id: string;
  deliveries: { total: number; delivered: number; failed: number; dead_letter: number; pending: number; paused: number };
}

export interface EventQuery extends PageQuery {
  since?: number | string;
  until?: number | string;
  type?: string;
  order?: 'asc' | 'desc';
}

export interface AuditRow {
  request_id: string;
  time: number;
  method: string;
  path: string;
  status: number;
  response_bytes: number;
  response_time_ms: number;
  client_ip: string | null;
  user_agent: string | null;
  key_prefix: string | null;
  project: string | null;
  idempotency_key: string | null;
  replayed: boolean;
  rate_limit_remaining: number | null;
}

export interface AuditQuery extends PageQuery {
  request_id?: string;
  method?: string;
  /** `200`, `4xx`, `5xx`… */
  status?: string | number;
  /** `*` is a wildcard. */
  path?: string;
  idempotency_key?: string;
  since?: number | string;
  until?: number | string;
}

export interface Stats {
  days: { date: string; requests: number; errors: number; server_errors: number }[];
  top_paths: { path: string; requests: number }[];
  error_share: number;
  p50_ms: number | null;
  p95_ms: number | null;
}

export interface TestResult {
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

export interface Inspector {
  id: string;
  url: string;
  expires_at: number;
}

export interface InspectedRequest {
  at: number;
  method: string;
  headers: Record<string, string>;
  body: string;
  signature_valid: boolean;
}

export interface PortalLink {
  url: string;
  expires_at: number;
}

/** The body of a webhook delivery (CONTRACT §7). */
export interface WebhookEvent<T = unknown> {
  id: string;
  type: string;
  /** RFC 3339. */
  timestamp: string;
  data: T;
}
