export { Postguard, idempotencyKeySegment, type CallOptions, type UsageOptions } from './api.js';
export {
  PostguardClient, uuidv4,
  type ClientOptions, type RequestOptions, type PostguardResponse, type ResponseInfo, type RetryInfo, type Credential, type QueryValue,
} from './client.js';
export { backoffDelay, parseRetryAfter, DEFAULT_BACKOFF, type BackoffOptions } from './backoff.js';
export { isRetryable, replaySafe, MUTATING_METHODS, type FailedAttempt } from './retry.js';
export { RateLimiter, reserveFor, type ThrottleOptions } from './limiter.js';
export { readRateLimit, bindingPolicy, type RateLimitInfo } from './ratelimit-headers.js';
export { systemClock, type Clock } from './clock.js';
export {
  PostguardError, ConfigurationError, ApiError, ApiKeyExpiredError, IdempotencyKeyReuseError, RateLimitError, RetriesExhaustedError, NetworkError,
  WebhookVerificationError,
  type Problem, type ErrorFields,
} from './errors.js';
export {
  verifyWebhook, WebhookReceiver, MemoryDedupeStore, MAX_TOLERANCE_S,
  type DedupeStore, type VerifyOptions, type ReceiverOptions, type Received, type HeaderInput,
} from './webhooks.js';
export {
  Operation, OperationFailedError,
  type OperationInfo, type OperationState, type OperationResult, type WaitOptions,
} from './operation.js';
export { VERSION } from './version.js';
export type * from './types.js';
