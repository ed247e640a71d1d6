// Resource shapes of the gateway's own API (docs/api-reference.md, docs/operating-webhooks.md, docs/dashboard-and-portal.md, docs/limits.md). Timestamps are
// epoch milliseconds unless said otherwise.

export interface Page<T> {
  data: T[];
  next_cursor: string | null;
}

export interface PageQuery {
  limit?: number;
  cursor?: string;
}

/** One policy's state now (`/me`, `GET /keys/{id}`); `reset` in epoch seconds. */
export interface PolicyState {
  name: string;
  limit: number;
  remaining: number;
  reset: number;
  window_s: number;
}

/** The concurrency quota: requests of the key in flight at the origin, of `limit`. */
export interface Inflight {
  limit: number;
  in_use: number;
  refused?: boolean;
}

export interface Me {
  prefix: string;
  project: string;
  plan: string;
  /** `limit`, `remaining`, `reset` (epoch seconds) and `window_s` are the binding policy's. */
  limit: number;
  remaining: number;
  /** Epoch seconds. */
  reset: number;
  window_s: number;
  /** When the key stops working (epoch ms), or null. */
  expires_at?: number | null;
  /** Every policy of the key's plan. */
  policies?: PolicyState[];
  /** Present when the plan has a concurrency quota. */
  inflight?: Inflight;
}

/** A named policy of a plan: `requests` per `window_s`. */
export interface PolicySpec {
  name: string;
  requests: number;
  window_s: number;
}

/**
 * A key's replacements of its plan's numbers (docs/limits.md): any of a plan's fields, e.g.
 * `{ requests_per_window: 7 }` or `{ policies: [...], concurrency: 2 }`.
 */
export interface PlanOverrides {
  requests_per_window?: number;
  window_s?: number;
  policies?: PolicySpec[];
  concurrency?: number;
  gateway?: { requests: number; window_s?: number };
  idempotency_ttl_s?: number;
  /**
   * `false`: report-only — every policy and the concurrency quota are counted and advertised,
   * but a request they would refuse is forwarded (its audit row says `would_refuse`).
   */
  enforce?: boolean;
  /**
   * Quota notices: the percentages (1–100) of each policy's limit at which the event
   * `postguard.quota.threshold` is published to the key's project, once per window and threshold.
   */
  notify_at?: number[];
}

export interface ApiKey {
  id: string;
  prefix: string;
  project: string;
  plan: string;
  name: string | null;
  created_at: number;
  revoked_at: number | null;
  /** Epoch ms, or null: never. */
  expires_at?: number | null;
  /** The operator's metadata, forwarded signed to the origin (`X-Postguard-Key-Meta`); null in lists. */
  meta?: Record<string, unknown> | null;
  /** Null in lists (`keys.get` shows them). */
  overrides?: PlanOverrides | null;
  /** When the operator last changed the key (epoch ms; 0: as created). */
  updated_at?: number;
  /** In lists: whether the key has metadata / overrides (`keys.get` shows them). */
  has_meta?: boolean;
  has_overrides?: boolean;
}

/** `GET /keys/{id}`: the key with the state of each of its policies now. */
export interface ApiKeyDetail extends ApiKey {
  policies: PolicyState[];
  inflight?: Inflight;
}

/** Returned once, on creation: `key` is never shown again. */
export interface CreatedApiKey extends ApiKey {
  key: string;
}

/** `expires_at`: epoch ms, or an RFC 3339 string; it must lie in the future. */
export interface CreateKeyInput {
  project: string;
  plan: string;
  name?: string;
  expires_at?: number | string;
  /** A JSON object of at most 1 KiB. */
  meta?: Record<string, unknown>;
  overrides?: PlanOverrides;
}

/**
 * `PATCH /keys/{id}`: each member given replaces the key's; `null` clears `name`, `meta`,
 * `overrides` or `expires_at`; a member left out is kept. Applies from the key's next request.
 */
export interface UpdateKeyInput {
  name?: string | null;
  plan?: string;
  meta?: Record<string, unknown> | null;
  overrides?: PlanOverrides | null;
  expires_at?: number | string | null;
}

/** What every imported key may carry besides the key or its hash: as in `CreateKeyInput`. */
interface ImportKeyFields {
  project: string;
  plan: string;
  name?: string | null;
  /** Epoch ms or RFC 3339. */
  expires_at?: number | string | null;
  /** A JSON object of at most 1 KiB. */
  meta?: Record<string, unknown> | null;
  overrides?: PlanOverrides | null;
}

/**
 * One key an API already issued, for `POST /keys/import`: the key itself (16–256 visible
 * ASCII characters, any format; `prefix` defaults to its first 12), or — when you do not want
 * to send keys — the lowercase hex SHA-256 of its bytes with the `prefix` logs and dashboards
 * show (1–12 visible ASCII characters).
 */
export type ImportKeyInput = ImportKeyFields &
  ({ key: string; sha256?: never; prefix?: string } | { sha256: string; prefix: string; key?: never });

/** One entry of `POST /keys/import`'s answer, in the order given. */
export interface ImportedKey {
  /** Derived from the key's hash: the same key has the same id in every call. */
  id: string;
  prefix: string;
  /** `exists`: a key with this hash was known and is left unchanged (a re-run is safe). */
  status: 'created' | 'exists';
}

/** `POST /keys/{id}/reroll`: a new secret for the same id; the old one works until `previous_expires_at`. */
export interface RerolledApiKey extends ApiKey {
  key: string;
  /** Epoch ms. */
  previous_expires_at: number;
}

export type IdempotencyState = 'in_progress' | 'completed' | 'expired' | 'unknown';

/**
 * `GET /idempotency/{key}`: what became of the request this API key sent under that
 * Idempotency-Key. `in_progress`: it runs (`expires_at` is the end of its lease);
 * `completed`: its answer is stored (`status`, `request_id`) and a resend with the same key
 * replays it until `expires_at`; `expired`: the record outlived its TTL or lease (a resend runs
 * anew); `unknown`: the gateway has no record of it (never arrived, or its answer was not kept
 * — a 5xx or a timeout is not stored).
 */
export interface IdempotencyStatus {
  state: IdempotencyState;
  /** The stored answer's status (completed, or expired after completing). */
  status?: number;
  request_id?: string;
  /** Epoch ms: the claim (in progress) or the completion. */
  created_at?: number;
  /** Epoch ms: the end of the lease (in progress) or of the TTL (completed). */
  expires_at?: number;
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
  /** What its receiver last advertised (RateLimit / X-RateLimit-*) while the reset is ahead; at 0 left, attempts wait for `reset_at` (epoch ms). */
  receiver_limit?: { remaining: number; reset_at: number } | null;
  /** How its endpoint answered the last 24 h (in list and get answers, gateway 0.4+). */
  health?: SubscriptionHealth;
}

/** A subscription's endpoint over the last 24 h: attempts to its current URL. */
export interface SubscriptionHealth {
  window_s: number;
  attempts: number;
  /** Answered 2xx. */
  succeeded: number;
  failed: number;
  /** succeeded ÷ attempts; null without attempts. */
  success_rate: number | null;
  last_attempt_at: number | null;
  last_status_code: number | null;
  last_error: string | null;
  state: 'idle' | 'healthy' | 'degraded' | 'failing';
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
  /**
   * A subscription moved from another system keeps its secret: `whsec_` + the standard base64
   * of 24–64 bytes; deliveries are signed with it. Without it the gateway makes one.
   */
  secret?: string;
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
  /** The event's ordering key; null without one. */
  ordering_key?: string | null;
  /** The delivery (same subscription and ordering key) this one waits for before its first attempt; null when not waiting. */
  blocked_by?: string | null;
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
  /** When the next automatic attempt is due (epoch ms), or null: none planned. */
  next_retry_at: number | null;
  /** The request id of the publish that created the delivery, on its first attempt. */
  publish_request_id?: string | null;
  /** The headers it was sent with, `webhook-signature` redacted (`v1,K5oZfz…`); null before gateway 0.4. */
  request_headers?: Record<string, string> | null;
  /** The receiver's response headers (at most 8, 256 bytes; cookies redacted); null without an answer. */
  response_headers?: Record<string, string> | null;
}

export interface DeliveryDetail extends Delivery {
  attempts: DeliveryAttempt[];
  /** The body the receiver gets; null once the event is past retention. */
  payload?: WebhookEvent | null;
}

export interface DeliveryQuery extends PageQuery {
  status?: DeliveryStatus;
  event_type?: string;
  subscription_id?: string;
  event_id?: string;
  since?: number | string;
  until?: number | string;
}

export interface PublishInput {
  project: string;
  type: string;
  data: unknown;
  /** The event id; generated (`evt_…`) when absent so that a retried publish is a no-op. */
  id?: string;
  /** Scheduled event: no attempt before this time — epoch ms or RFC 3339, at most 7 days ahead. */
  deliver_at?: number | string;
  /**
   * Ordering key (1–128 visible ASCII): per subscription, events with the same key are attempted
   * in publish order; other keys and events without one go in parallel.
   */
  ordering_key?: string;
}

export interface EventRow {
  id: string;
  type: string;
  timestamp: number | string;
  data: unknown;
  request_id: string;
  /** The ordering key it was published with; null without one. */
  ordering_key?: string | null;
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
  response_bytes: number | null;
  response_time_ms: number;
  client_ip: string | null;
  user_agent: string | null;
  key_prefix: string | null;
  project: string | null;
  idempotency_key: string | null;
  replayed: boolean;
  rate_limit_remaining: number | null;
  /** The origin a proxied request was routed to (`default` or an `origins` name); null when not forwarded (or before gateway 0.4). */
  origin?: string | null;
  /** Report-only limits: the policy (or `inflight`) that would have refused this forwarded request. */
  would_refuse?: string | null;
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
  /** false: only requests proxied to the origin (the gateway's own calls left out). */
  include_gateway?: boolean;
}

/** `GET /_postguard/v1/keys/activity` (operator): a key's use within the window. */
export interface KeyActivity {
  key_prefix: string;
  requests: number;
  errors: number;
  last_used_at: number;
}

export interface StatsDay {
  date: string;
  requests: number;
  errors: number;
  server_errors: number;
  /**
   * Proxied requests without an Idempotency-Key where the mode is `required`: forwarded before
   * `idempotency.required_from`, refused after.
   */
  missing_idempotency_key: number;
}

export interface Stats {
  days: StatsDay[];
  top_paths: { path: string; requests: number }[];
  error_share: number;
  p50_ms: number | null;
  p95_ms: number | null;
  /** The keys that sent such requests in the period, most first (at most 50): whom to tell. */
  keys_missing_idempotency: { key_prefix: string; requests: number }[];
}

/** `GET /usage`'s parameters: `since`/`until` epoch ms or RFC 3339 (default the last 7 days). */
export interface UsageQuery {
  since?: number | string;
  until?: number | string;
  /** Default `day`. */
  granularity?: 'hour' | 'day';
  /** The operator's: one project (default every project). An API key reads its own. */
  project?: string;
}

/** One key's proxied requests in one period (`GET /usage`). */
export interface Usage {
  key_prefix: string;
  project: string;
  /** The period's first millisecond (UTC, epoch ms). */
  period_start: number;
  /** Every request. */
  requests: number;
  /** Forwarded to the origin. */
  admitted: number;
  /**
   * Each operation once: with an Idempotency-Key, the execution whose final answer was stored
   * (never its replays, 409s or retries after a 5xx); without, forwarded and answered below 500.
   */
  billable: number;
  /** Stored answers replayed. */
  replays: number;
  /** 429s. */
  refused: number;
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

/** The body of a webhook delivery (docs/webhooks.md). */
export interface WebhookEvent<T = unknown> {
  id: string;
  type: string;
  /** RFC 3339. */
  timestamp: string;
  data: T;
}
