/**
 * Which failed attempts are retried — the rule shared by the three postguard SDKs. Pure: the
 * client passes what it knows of the call and of the answer.
 *
 * - 429 and 409 `IDEMPOTENCY_KEY_IN_PROGRESS` were not executed: always retried.
 * - A lost answer (network error, timeout) and 502/503/504 may have been executed: retried only
 *   when a second attempt cannot execute twice — a safe method (GET/HEAD/OPTIONS), or a call that
 *   carries an Idempotency-Key (the gateway answers a repeated key with the stored result). A
 *   mutating call without a key is never retried after such a failure.
 * - Every other answer (2xx/3xx, 400, 401, 403, 404, 422, 500, …) is final.
 */

/** Methods that change state: each call gets one Idempotency-Key for all its attempts. */
export const MUTATING_METHODS: ReadonlySet<string> = new Set(['POST', 'PUT', 'PATCH', 'DELETE']);
const SAFE_METHODS: ReadonlySet<string> = new Set(['GET', 'HEAD', 'OPTIONS']);
const MAYBE_EXECUTED: ReadonlySet<number> = new Set([502, 503, 504]);
const IN_PROGRESS = 'IDEMPOTENCY_KEY_IN_PROGRESS';

/**
 * Whether a repeated attempt of this call is harmless when the first may have run: a safe
 * method, or a call carrying an Idempotency-Key. `override` is the caller's `retrySafe`.
 */
export function replaySafe(method: string, idempotencyKey: string | undefined, override?: boolean): boolean {
  return override ?? (idempotencyKey !== undefined || SAFE_METHODS.has(method.toUpperCase()));
}

/** An attempt's failure: an answer (`status`, the problem's `code`) or none (`status` undefined). */
export interface FailedAttempt {
  status?: number;
  code?: string;
}

/** Whether the failure is worth another attempt of a call that is (or is not) `replaySafe`. */
export function isRetryable(failure: FailedAttempt, safe: boolean): boolean {
  const { status, code } = failure;
  if (status === 429) return true;
  if (status === 409) return code === IN_PROGRESS;
  if (status === undefined) return safe;
  return safe && MAYBE_EXECUTED.has(status);
}
