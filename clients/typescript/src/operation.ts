import { parseRetryAfter } from './backoff.js';
import type { Clock } from './clock.js';
import { ApiError, PostguardError, RetriesExhaustedError } from './errors.js';

/** The states of an asynchronous operation (docs/async-operations.md). */
export type OperationState = 'queued' | 'running' | 'succeeded' | 'failed';

/** `GET /_postguard/v1/operations/{id}`. */
export interface OperationInfo {
  id: string;
  state: OperationState;
  /** The kept answer's status, once done (absent when no attempt got an answer). */
  status?: number;
  /** The request that created it: the 202's `X-Request-Id`. */
  request_id: string;
  created_at: number;
  completed_at?: number;
  method: string;
  path: string;
  attempts: number;
  /** Why a `failed` operation has no answer it keeps; absent otherwise. */
  reason?: 'timeout' | 'unreachable' | 'not_kept' | 'attempts_spent' | 'body_missing' | 'key_revoked' | 'key_expired';
}

/** What an operation handle needs of its client (a `PostguardClient`). */
export interface OperationHost {
  request(method: string, path: string, options?: { maxAttempts?: number; signal?: AbortSignal }): Promise<{
    status: number;
    headers: Headers;
    data: unknown;
  }>;
  readonly clock: Clock;
}

export interface WaitOptions {
  /** Give up (PostguardError `OPERATION_WAIT_TIMEOUT`) after this long; default: wait as long as it takes. */
  timeoutMs?: number;
  signal?: AbortSignal;
  /** Polls at least this far apart and at most `maxIntervalMs` (defaults 1 s and 30 s), within `Retry-After`. */
  minIntervalMs?: number;
  maxIntervalMs?: number;
}

/**
 * A `failed` operation: the origin could not be reached, or answered 5xx, through the whole retry
 * schedule. `status` and `body` are the operation's last answer (or the gateway's 502
 * `ORIGIN_UNREACHABLE` problem when no attempt got one).
 */
export class OperationFailedError extends ApiError {}

const OPERATIONS = '/_postguard/v1/operations/';

/** An answer: the operation's result, or a synchronous answer. */
export interface OperationResult<T> {
  status: number;
  headers: Headers;
  data: T;
}

/**
 * An asynchronous operation (`request(…, { async: true })`): the request was stored and will run
 * once; `wait()` polls it (honouring `Retry-After`) and resolves with its result. Sending the same
 * request again with the same Idempotency-Key gives back the same operation. On a route the
 * gateway does not run asynchronously the answer comes at once: the handle is then done already
 * (`id` undefined) and `wait()` resolves with that answer.
 */
export class Operation<T = unknown> {
  /** The operation's id (`op_…`); undefined when the gateway answered synchronously. */
  readonly id: string | undefined;
  /** Its `Location`: `/_postguard/v1/operations/{id}`. */
  readonly location: string | undefined;
  readonly idempotencyKey: string | undefined;
  /** What the gateway last said about it (undefined for a synchronous answer). */
  info: OperationInfo | undefined;
  readonly #host: OperationHost;
  readonly #answered: OperationResult<T> | undefined;

  constructor(host: OperationHost, info: OperationInfo | undefined, idempotencyKey: string | undefined, answered?: OperationResult<T>) {
    this.#host = host;
    this.info = info;
    this.id = info?.id;
    this.location = info ? `${OPERATIONS}${encodeURIComponent(info.id)}` : undefined;
    this.idempotencyKey = idempotencyKey;
    this.#answered = answered;
  }

  get state(): OperationState {
    return this.info?.state ?? 'succeeded';
  }

  get done(): boolean {
    return this.state === 'succeeded' || this.state === 'failed';
  }

  /** Reads the operation again; the answer's `Retry-After` (ms) says when to look next. */
  async refresh(signal?: AbortSignal): Promise<{ info: OperationInfo | undefined; retryAfterMs: number | undefined }> {
    if (this.location === undefined) return { info: undefined, retryAfterMs: undefined };
    const res = await this.#host.request('GET', this.location, { signal });
    this.info = res.data as OperationInfo;
    return { info: this.info, retryAfterMs: parseRetryAfter(res.headers.get('retry-after'), this.#host.clock.now()) };
  }

  /**
   * The kept answer of a done operation: resolves with it when `succeeded`; throws
   * `OperationFailedError` with the last answer when `failed`, ApiError `OPERATION_NOT_DONE` before.
   */
  async result(signal?: AbortSignal): Promise<OperationResult<T>> {
    if (this.#answered !== undefined || this.location === undefined || this.info === undefined) {
      if (this.#answered === undefined) throw new PostguardError('an operation handle without an operation', { code: 'OPERATION_MISSING' });
      return this.#answered;
    }
    const failed = this.info.state === 'failed';
    try {
      // A failed operation's answer is a 5xx that must not be retried as if it were a lost one.
      const res = await this.#host.request('GET', `${this.location}/result`, { signal, maxAttempts: failed ? 1 : undefined });
      return { status: res.status, headers: res.headers, data: res.data as T };
    } catch (e) {
      // With one attempt, a 5xx comes back as the exhausted call's cause.
      const answer = e instanceof RetriesExhaustedError ? e.cause : e;
      if (failed && answer instanceof ApiError) {
        throw new OperationFailedError(`operation ${this.id} failed: ${answer.message}`, {
          status: answer.status, code: answer.code, detail: answer.detail, requestId: this.info.request_id,
          idempotencyKey: this.idempotencyKey, problem: answer.problem, headers: answer.headers, body: answer.body, cause: e,
        });
      }
      throw e;
    }
  }

  /** Polls until the operation is done (each poll after its `Retry-After`), then returns `result()`. */
  async wait(options: WaitOptions = {}): Promise<OperationResult<T>> {
    const clock = this.#host.clock;
    const deadline = options.timeoutMs === undefined ? Number.POSITIVE_INFINITY : clock.now() + options.timeoutMs;
    const min = options.minIntervalMs ?? 1000;
    const max = Math.max(min, options.maxIntervalMs ?? 30_000);
    while (!this.done) {
      const { retryAfterMs } = await this.refresh(options.signal);
      if (this.done) break;
      const left = deadline - clock.now();
      if (left <= 0) {
        throw new PostguardError(`operation ${this.id} is still ${this.state}`, { code: 'OPERATION_WAIT_TIMEOUT', idempotencyKey: this.idempotencyKey });
      }
      const pause = Math.min(Math.max(retryAfterMs ?? min, min), max, left);
      await clock.sleep(pause, options.signal);
    }
    return this.result(options.signal);
  }
}
