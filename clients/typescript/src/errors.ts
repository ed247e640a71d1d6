/** An RFC 9457 problem as postguard sends it (`code` from its published list). */
export interface Problem {
  type?: string;
  title?: string;
  status?: number;
  detail?: string;
  code?: string;
  request_id?: string;
  [extra: string]: unknown;
}

export interface ErrorFields {
  status?: number;
  code?: string;
  detail?: string;
  requestId?: string;
  /** Attempts made for this logical call (1 = no retry). */
  attempts?: number;
  idempotencyKey?: string;
  problem?: Problem;
  cause?: unknown;
}

/**
 * Base class of every error the SDK throws. Every one carries a `code`: the problem's
 * (postguard's published list), or the class's own (`defaultCode`) — the same codes as the
 * Python SDK's (`CLIENT_CONFIGURATION`, `NETWORK_ERROR`, `HTTP_ERROR`…).
 */
export class PostguardError extends Error {
  /** The `code` of an instance that was given none. */
  static readonly defaultCode: string = 'POSTGUARD_ERROR';
  readonly status?: number;
  readonly code: string;
  readonly detail?: string;
  readonly requestId?: string;
  readonly attempts?: number;
  readonly idempotencyKey?: string;
  readonly problem?: Problem;

  constructor(message: string, fields: ErrorFields = {}) {
    super(message, fields.cause === undefined ? undefined : { cause: fields.cause });
    this.name = new.target.name;
    this.status = fields.status;
    this.code = fields.code ?? (new.target as typeof PostguardError).defaultCode;
    this.detail = fields.detail;
    this.requestId = fields.requestId;
    this.attempts = fields.attempts;
    this.idempotencyKey = fields.idempotencyKey;
    this.problem = fields.problem;
  }
}

/** A missing or invalid client option or argument (no `apiKey` for a call that needs one…). */
export class ConfigurationError extends PostguardError {
  static override readonly defaultCode: string = 'CLIENT_CONFIGURATION';
}

/**
 * An error response that is not retried (400, 401, 403, 404, 422, other 4xx…); an answer
 * that is not problem+json gets the code `HTTP_ERROR`.
 */
export class ApiError extends PostguardError {
  static override readonly defaultCode: string = 'HTTP_ERROR';
  /** The response headers. */
  readonly headers?: Headers;
  /** The parsed body: the problem, other JSON, or text. */
  readonly body?: unknown;

  constructor(message: string, fields: ErrorFields & { headers?: Headers; body?: unknown }) {
    super(message, fields);
    this.headers = fields.headers;
    this.body = fields.body;
  }
}

/** 422 `IDEMPOTENCY_KEY_REUSE_CONFLICT`: this key was used with another request. A bug, never retried. */
export class IdempotencyKeyReuseError extends ApiError {}

/** 401 `API_KEY_EXPIRED`: the key passed its `expires_at` (or a rerolled key its grace). Never retried. */
export class ApiKeyExpiredError extends ApiError {}

/**
 * 429: a quota refused the request — `RATE_LIMIT_EXCEEDED` (a window policy) or
 * `CONCURRENCY_LIMIT_EXCEEDED` (too many requests of the key in flight). Retried after its
 * `Retry-After`; once the attempts are spent it is the `cause` of the `RetriesExhaustedError`.
 */
export class RateLimitError extends ApiError {
  /** The problem's `violated-policies`: every policy that refused (`inflight` for the concurrency quota). */
  readonly violatedPolicies: string[];
  /** The policy that binds: the first member of `RateLimit` (the gateway lists it first), else the first violated one. */
  readonly policy?: string;
  /** `Retry-After` in ms, when the answer had one. */
  readonly retryAfterMs?: number;

  constructor(
    message: string,
    fields: ErrorFields & { headers?: Headers; body?: unknown; violatedPolicies?: string[]; policy?: string; retryAfterMs?: number },
  ) {
    super(message, fields);
    this.violatedPolicies = fields.violatedPolicies ?? [];
    this.policy = fields.policy ?? this.violatedPolicies[0];
    this.retryAfterMs = fields.retryAfterMs;
  }
}

/**
 * The call failed on every attempt (network errors, timeouts, 429, 409 in progress, 502/503/504);
 * `cause` is the last attempt's error (a `RateLimitError` after 429s).
 */
export class RetriesExhaustedError extends PostguardError {}

/** No response: connection refused or reset, DNS, or the per-attempt timeout (`timedOut`). */
export class NetworkError extends PostguardError {
  static override readonly defaultCode: string = 'NETWORK_ERROR';
  readonly timedOut: boolean;

  constructor(message: string, fields: ErrorFields & { timedOut?: boolean }) {
    super(message, fields);
    this.timedOut = fields.timedOut ?? false;
  }
}

/** A webhook whose signature, headers or timestamp do not verify. */
export class WebhookVerificationError extends PostguardError {
  static override readonly defaultCode: string = 'WEBHOOK_SIGNATURE_INVALID';
}
