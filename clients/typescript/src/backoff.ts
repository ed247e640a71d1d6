/**
 * The retry delay rule, the same in the three postguard SDKs:
 *
 *   delay = max(Retry-After, base) · 2^attempt · (1 + jitter),  jitter ∈ [0, jitterRatio)
 *   capped at `maxDelayMs` — but never below Retry-After, which is a floor the server
 *   promises (a request sent earlier is rejected again), so it is never shortened.
 *
 * `attempt` is 0 for the first retry. Pure: the caller passes the random source.
 */
export interface BackoffOptions {
  /** Delay of the first retry when the server gave no Retry-After (ms). Default 500. */
  baseDelayMs?: number;
  /** Upper bound of a computed delay (ms). Default 60 000. Retry-After above it still wins. */
  maxDelayMs?: number;
  /** Jitter as a share of the delay: a uniform draw in [0, ratio). Default 0.3. */
  jitterRatio?: number;
}

export const DEFAULT_BACKOFF: Required<BackoffOptions> = {
  baseDelayMs: 500,
  maxDelayMs: 60_000,
  jitterRatio: 0.3,
};

export function backoffDelay(
  attempt: number,
  retryAfterMs: number | undefined,
  random: () => number,
  options: BackoffOptions = {},
): number {
  const { baseDelayMs, maxDelayMs, jitterRatio } = { ...DEFAULT_BACKOFF, ...options };
  const floor = retryAfterMs !== undefined && retryAfterMs > 0 ? retryAfterMs : 0;
  const start = Math.max(floor, baseDelayMs);
  const exp = start * 2 ** Math.max(0, attempt);
  const jittered = exp * (1 + jitterRatio * clampUnit(random()));
  return Math.max(floor, Math.min(maxDelayMs, jittered));
}

/** A random source outside [0, 1) must not stretch or shrink the jitter range. */
function clampUnit(x: number): number {
  if (!Number.isFinite(x) || x < 0) return 0;
  return x >= 1 ? 1 - Number.EPSILON : x;
}

/**
 * `Retry-After` as milliseconds: delta-seconds or an HTTP date (RFC 9110 §10.2.3).
 * Anything else is ignored (undefined) rather than guessed.
 */
export function parseRetryAfter(value: string | null | undefined, nowMs: number): number | undefined {
  if (value === null || value === undefined) return undefined;
  const v = value.trim();
  if (/^\d+$/.test(v)) return Number(v) * 1000;
  const date = Date.parse(v);
  if (!Number.isNaN(date) && /[a-z]/i.test(v)) return Math.max(0, date - nowMs);
  return undefined;
}
