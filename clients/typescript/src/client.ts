import { backoffDelay, parseRetryAfter, type BackoffOptions } from './backoff.js';
import { systemClock, type Clock } from './clock.js';
import {
  ApiError, ApiKeyExpiredError, ConfigurationError, IdempotencyKeyReuseError, NetworkError, PostguardError, RateLimitError, RetriesExhaustedError,
  type Problem,
} from './errors.js';
import { RateLimiter, type ThrottleOptions } from './limiter.js';
import { bindingPolicy, readRateLimit } from './ratelimit-headers.js';
import { Operation, type OperationInfo } from './operation.js';
import { MUTATING_METHODS, isRetryable, replaySafe } from './retry.js';
import { VERSION } from './version.js';

export type Credential = 'apiKey' | 'admin' | 'origin' | 'none';
export type QueryValue = string | number | boolean | null | undefined;

export interface ClientOptions {
  /** The gateway, e.g. `https://api.example.com` (a path prefix is kept). */
  baseUrl: string;
  /** API key for proxied calls and the key-authenticated gateway endpoints. */
  apiKey?: string;
  /** `ADMIN_TOKEN`, for the operator endpoints (keys, portal links). */
  adminToken?: string;
  /** `ORIGIN_TOKEN`, for publishing events. */
  originToken?: string;
  /** Per-attempt timeout, response body included (default 30 000 ms). */
  timeoutMs?: number;
  /** Largest response body read (default 128 MiB); a larger one throws PostguardError RESPONSE_TOO_LARGE. */
  maxResponseBytes?: number;
  /** Attempts per logical call, the first included (default 5). */
  maxAttempts?: number;
  backoff?: BackoffOptions;
  /**
   * Proactive throttling of calls through the API from its rate-limit headers (default on,
   * keeping a tenth of the limit in reserve); `false` turns it off. The gateway's own endpoints
   * have a budget of their own and are not throttled.
   */
  throttle?: ThrottleOptions | false;
  /** Sent as User-Agent (default `postguard-client-typescript/<version>`); `false` sends none. */
  userAgent?: string | false;
  /** Headers added to every request. */
  headers?: Record<string, string>;
  fetch?: typeof fetch;
  clock?: Clock;
  random?: () => number;
  /** Idempotency-Key factory (default: a UUIDv4 from Web Crypto). */
  generateIdempotencyKey?: () => string | Promise<string>;
  /** Called for every HTTP response, retried attempts included (e.g. to count 429s). */
  onResponse?: (info: ResponseInfo) => void;
  /** Called before each retry with the delay chosen. */
  onRetry?: (info: RetryInfo) => void;
}

export interface RequestOptions {
  /** JSON-serialised unless a string or bytes. */
  body?: unknown;
  query?: Record<string, QueryValue>;
  headers?: Record<string, string>;
  /**
   * Your key for this operation; default: generated once per call (mutating methods only).
   * `null` sends none — then a lost answer of a mutating call is not retried (it may have run).
   */
  idempotencyKey?: string | null;
  /** Which configured credential to send (default `apiKey`), or `token` to give one. */
  auth?: Credential;
  token?: string;
  timeoutMs?: number;
  maxAttempts?: number;
  signal?: AbortSignal;
  /**
   * Whether a lost answer (network error, timeout, 502/503/504) may be retried: by default true
   * for GET/HEAD/OPTIONS and for calls carrying an Idempotency-Key (the gateway answers a retry
   * with the stored result), false for a mutating call without one. Set false for routes where
   * the gateway has idempotency `off`; 429 and 409-in-progress are retried anyway.
   */
  retrySafe?: boolean;
  /**
   * Ask the gateway to run the call as an asynchronous operation (`Prefer: respond-async`, on the
   * routes its operator named): `request()` then resolves with an `Operation` at once, whose
   * `wait()` polls it and resolves with the result. The Idempotency-Key is what makes a retry the
   * same operation, so one is always sent (`idempotencyKey: null` is refused).
   */
  async?: boolean;
}

export interface PostguardResponse<T = unknown> {
  status: number;
  headers: Headers;
  /** Parsed JSON when the response is JSON, else its text (undefined when empty). */
  data: T;
  /** `Idempotent-Replayed: true`: the gateway answered from its store; the origin did not run again. */
  replayed: boolean;
  requestId: string | undefined;
  idempotencyKey: string | undefined;
  attempts: number;
}

export interface ResponseInfo {
  method: string;
  path: string;
  status: number;
  /** Which attempt of the call this answer belongs to (1 = the first). */
  attempt: number;
  requestId: string | undefined;
  idempotencyKey: string | undefined;
  replayed: boolean;
  headers: Headers;
}

export interface RetryInfo {
  method: string;
  path: string;
  /** Attempts made so far (1 before the first retry). */
  attempt: number;
  delayMs: number;
  idempotencyKey: string | undefined;
  /** The status that caused the retry, or undefined for a network error. */
  status: number | undefined;
  error: unknown;
}

/** The gateway replays stored answers up to 100 MiB; allow those, and a little more. */
const DEFAULT_MAX_RESPONSE_BYTES = 128 * 1024 * 1024;

/**
 * A UUIDv4 from Web Crypto (randomUUID needs a secure context in browsers; getRandomValues does
 * not). Node 18 has no global `crypto` in modules: there it comes from `node:crypto`, imported
 * through a variable so that bundlers for browsers and Workers leave it out.
 */
export async function uuidv4(): Promise<string> {
  let c = (globalThis as { crypto?: Crypto }).crypto;
  if (!c?.getRandomValues) {
    const name = 'node:crypto';
    try {
      c = ((await import(/* webpackIgnore: true */ /* @vite-ignore */ name)) as { webcrypto: Crypto }).webcrypto;
    } catch {
      throw new ConfigurationError('no Web Crypto: pass generateIdempotencyKey to the client');
    }
  }
  if (c.randomUUID) return c.randomUUID();
  const b = c.getRandomValues(new Uint8Array(16));
  b[6] = ((b[6] ?? 0) & 0x0f) | 0x40;
  b[8] = ((b[8] ?? 0) & 0x3f) | 0x80;
  const h = [...b].map((x) => x.toString(16).padStart(2, '0')).join('');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

function encodeBody(body: unknown): { payload?: BodyInit; contentType?: string } {
  if (body === undefined) return {};
  if (typeof body === 'string') return { payload: body, contentType: 'text/plain; charset=utf-8' };
  if (body instanceof Uint8Array || body instanceof ArrayBuffer) {
    return { payload: body as BodyInit, contentType: 'application/octet-stream' };
  }
  return { payload: JSON.stringify(body), contentType: 'application/json' };
}

/** The body as text, refusing to hold more than `max` bytes (a misbehaving server cannot exhaust memory). */
async function readText(res: Response, max: number): Promise<string> {
  const declared = Number(res.headers.get('content-length') ?? Number.NaN);
  if (declared > max) {
    await res.body?.cancel();
    throw new ResponseTooLargeError(max);
  }
  if (!res.body) return res.text();
  const reader = res.body.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    size += value.byteLength;
    if (size > max) {
      await reader.cancel();
      throw new ResponseTooLargeError(max);
    }
    chunks.push(value);
  }
  const all = new Uint8Array(size);
  let at = 0;
  for (const c of chunks) {
    all.set(c, at);
    at += c.byteLength;
  }
  return new TextDecoder().decode(all);
}

class ResponseTooLargeError extends PostguardError {
  constructor(max: number) {
    super(`response body over maxResponseBytes (${max})`, { code: 'RESPONSE_TOO_LARGE' });
  }
}

async function readBody(res: Response, max: number): Promise<unknown> {
  const text = await readText(res, max);
  if (text.length === 0) return undefined;
  if (/\bjson\b/i.test(res.headers.get('content-type') ?? '')) {
    try {
      return JSON.parse(text) as unknown;
    } catch {
      return text;
    }
  }
  return text;
}

function asProblem(body: unknown): Problem | undefined {
  return body !== null && typeof body === 'object' && !Array.isArray(body) ? (body as Problem) : undefined;
}

/** A key given as a per-call `Idempotency-Key` header (any case) rather than as `idempotencyKey`. */
function keyHeader(headers: Record<string, string> | undefined): string | undefined {
  const name = Object.keys(headers ?? {}).find((k) => k.toLowerCase() === 'idempotency-key');
  return name === undefined ? undefined : headers?.[name];
}

/**
 * A gateway endpoint (`/_postguard/…`): charged to the key's gateway policy, or free (`/me`, the
 * idempotency lookup) — never to the API's budget, so the limiter neither holds it back nor
 * reads its answer (whose headers may describe that other budget).
 */
function isGatewayPath(path: string): boolean {
  return /^\/?_postguard(\/|$)/.test(path);
}

/** One attempt's outcome: an answer, or a failure without one. */
type Attempt =
  | { kind: 'response'; res: Response; body: unknown }
  | { kind: 'failure'; error: NetworkError };

export class PostguardClient {
  readonly baseUrl: string;
  // ECMAScript private fields, not TypeScript `private`: the options hold the credentials, and
  // `console.log(client)`, `util.inspect` and `JSON.stringify` never show a `#` field.
  readonly #opts: ClientOptions;
  readonly #clock: Clock;
  readonly #random: () => number;
  readonly #fetch: typeof fetch;
  readonly #limiter: RateLimiter;

  constructor(options: ClientOptions) {
    if (!options?.baseUrl) throw new ConfigurationError('PostguardClient: baseUrl is required');
    this.#opts = { ...options };
    this.baseUrl = options.baseUrl.replace(/\/+$/, '');
    this.#clock = options.clock ?? systemClock;
    this.#random = options.random ?? Math.random;
    this.#fetch = options.fetch ?? ((input, init) => globalThis.fetch(input, init));
    this.#limiter = new RateLimiter(options.throttle === false ? { enabled: false } : (options.throttle ?? {}), this.#clock);
  }

  /** Calls of this client through the API (not the gateway's own endpoints) sent and not yet answered. */
  get inFlight(): number {
    return this.#limiter.pending;
  }

  /**
   * Any call through the gateway (the origin's own API, or a gateway endpoint). A mutating
   * method gets one Idempotency-Key for the whole call, sent unchanged on every retry; it is
   * retried after a lost answer only because it carries that key (see `retry.ts`).
   * Resolves for status < 400; throws ApiError (or IdempotencyKeyReuseError) for an error that
   * is not retried, RetriesExhaustedError when every attempt failed.
   */
  request<T = unknown>(method: string, path: string, options: RequestOptions & { async: true }): Promise<Operation<T>>;
  request<T = unknown>(method: string, path: string, options?: RequestOptions): Promise<PostguardResponse<T>>;
  async request<T = unknown>(method: string, path: string, options: RequestOptions = {}): Promise<PostguardResponse<T> | Operation<T>> {
    if (options.async) return this.#operation<T>(method, path, options);
    return this.#call<T>(method, path, options);
  }

  /**
   * `request()` with `Prefer: respond-async`: a 202 with an operation's `Location` is the
   * operation; any other answer (a route the gateway runs synchronously) is a done handle.
   */
  async #operation<T>(method: string, path: string, options: RequestOptions): Promise<Operation<T>> {
    if (options.idempotencyKey === null) throw new ConfigurationError('an asynchronous call needs an Idempotency-Key');
    const m = method.toUpperCase();
    const idempotencyKey = options.idempotencyKey ?? keyHeader(options.headers) ?? (await (this.#opts.generateIdempotencyKey ?? uuidv4)());
    const prefer = Object.entries(options.headers ?? {}).find(([k]) => k.toLowerCase() === 'prefer')?.[1];
    const headers = { ...options.headers, prefer: prefer ? `respond-async, ${prefer}` : 'respond-async' };
    const res = await this.#call<T>(m, path, { ...options, async: false, headers, idempotencyKey });
    const location = res.headers.get('location') ?? '';
    if (res.status === 202 && location.startsWith('/_postguard/v1/operations/')) {
      return new Operation<T>(this.#host(), res.data as unknown as OperationInfo, res.idempotencyKey);
    }
    return new Operation<T>(this.#host(), undefined, res.idempotencyKey, { status: res.status, headers: res.headers, data: res.data });
  }

  /** The handle of an existing operation by its id (after a restart, from a stored id). */
  async operation<T = unknown>(id: string, options: Pick<RequestOptions, 'signal'> = {}): Promise<Operation<T>> {
    const res = await this.#call<OperationInfo>('GET', `/_postguard/v1/operations/${encodeURIComponent(id)}`, options);
    return new Operation<T>(this.#host(), res.data, undefined);
  }

  #host() {
    return { request: (m: string, p: string, o?: RequestOptions) => this.#call(m, p, o ?? {}), clock: this.#clock };
  }

  async #call<T = unknown>(method: string, path: string, options: RequestOptions = {}): Promise<PostguardResponse<T>> {
    const m = method.toUpperCase();
    const key = await this.#key(m, options.idempotencyKey !== undefined ? options.idempotencyKey : keyHeader(options.headers));
    const retrySafe = replaySafe(m, key, options.retrySafe);
    const maxAttempts = Math.max(1, options.maxAttempts ?? this.#opts.maxAttempts ?? 5);
    const url = this.url(path, options.query);
    const headers = this.headers(options, key);
    const { payload, contentType } = encodeBody(options.body);
    if (contentType && !Object.keys(headers).some((h) => h.toLowerCase() === 'content-type')) headers['content-type'] = contentType;
    const init: RequestInit = { method: m, headers, body: payload };

    const throttled = !isGatewayPath(path);
    for (let attempt = 0; ; attempt++) {
      const outcome = await this.attempt(url, init, options, throttled);
      const last = attempt + 1 >= maxAttempts;
      if (outcome.kind === 'failure') {
        if (!isRetryable({}, retrySafe)) throw outcome.error;
        if (last) throw this.exhausted(m, path, attempt + 1, key, outcome.error);
        await this.pause(m, path, attempt, key, undefined, outcome.error, undefined, options.signal);
        continue;
      }
      const { res, body } = outcome;
      const info = this.report(m, path, attempt, key, res);
      if (res.status < 400) {
        return { status: res.status, headers: res.headers, data: body as T, replayed: info.replayed, requestId: info.requestId, idempotencyKey: key, attempts: attempt + 1 };
      }
      const err = this.apiError(m, path, res, body, attempt + 1, key);
      if (!isRetryable({ status: res.status, code: err.code }, retrySafe)) throw err;
      if (last) throw this.exhausted(m, path, attempt + 1, key, err);
      const retryAfter = parseRetryAfter(res.headers.get('retry-after'), this.#clock.now());
      await this.pause(m, path, attempt, key, res.status, err, retryAfter, options.signal);
    }
  }

  /** The call's Idempotency-Key: the caller's, none (`null`), or a new one for a mutating method. */
  async #key(method: string, given: string | null | undefined): Promise<string | undefined> {
    if (given === null) return undefined;
    if (given !== undefined || !MUTATING_METHODS.has(method)) return given;
    return (this.#opts.generateIdempotencyKey ?? uuidv4)();
  }

  private async attempt(url: string, init: RequestInit, options: RequestOptions, throttled: boolean): Promise<Attempt> {
    const limiter = throttled ? this.#limiter : undefined;
    await limiter?.acquire(options.signal);
    const sentAt = this.#clock.now();
    const timeoutMs = options.timeoutMs ?? this.#opts.timeoutMs ?? 30_000;
    const ctl = new AbortController();
    const timer = setTimeout(() => ctl.abort(new NetworkError(`no answer within ${timeoutMs} ms`, { timedOut: true })), timeoutMs);
    const onAbort = () => ctl.abort(options.signal?.reason);
    options.signal?.addEventListener('abort', onAbort, { once: true });
    let answered = false;
    let res: Response | undefined;
    try {
      res = await this.#fetch(url, { ...init, signal: ctl.signal });
      answered = true;
      const body = await readBody(res, this.#opts.maxResponseBytes ?? DEFAULT_MAX_RESPONSE_BYTES);
      limiter?.release(readRateLimit(res.headers), sentAt, this.#clock.now(), true);
      return { kind: 'response', res, body };
    } catch (e) {
      limiter?.release(res ? readRateLimit(res.headers) : undefined, sentAt, this.#clock.now(), answered);
      if (options.signal?.aborted) throw options.signal.reason;
      if (e instanceof ResponseTooLargeError) throw e; // the same answer would come again
      const reason = ctl.signal.aborted ? ctl.signal.reason : e;
      const error =
        reason instanceof NetworkError
          ? reason
          : new NetworkError(`network error: ${reason instanceof Error ? reason.message : String(reason)}`, { cause: reason });
      return { kind: 'failure', error };
    } finally {
      clearTimeout(timer);
      options.signal?.removeEventListener('abort', onAbort);
    }
  }

  private async pause(
    method: string,
    path: string,
    attempt: number,
    key: string | undefined,
    status: number | undefined,
    error: unknown,
    retryAfterMs: number | undefined,
    signal?: AbortSignal,
  ): Promise<void> {
    const delayMs = backoffDelay(attempt, retryAfterMs, this.#random, this.#opts.backoff);
    this.#opts.onRetry?.({ method, path, attempt: attempt + 1, delayMs, idempotencyKey: key, status, error });
    await this.#clock.sleep(delayMs, signal);
  }

  private report(method: string, path: string, attempt: number, key: string | undefined, res: Response): ResponseInfo {
    const info: ResponseInfo = {
      method,
      path,
      status: res.status,
      attempt: attempt + 1,
      requestId: res.headers.get('x-request-id') ?? undefined,
      idempotencyKey: key,
      replayed: res.headers.get('idempotent-replayed') === 'true',
      headers: res.headers,
    };
    this.#opts.onResponse?.(info);
    return info;
  }

  private apiError(method: string, path: string, res: Response, body: unknown, attempts: number, key: string | undefined): ApiError {
    const p = asProblem(body);
    const fields = {
      status: res.status,
      code: typeof p?.code === 'string' ? p.code : undefined,
      detail: typeof p?.detail === 'string' ? p.detail : undefined,
      requestId: (typeof p?.request_id === 'string' ? p.request_id : undefined) ?? res.headers.get('x-request-id') ?? undefined,
      attempts,
      idempotencyKey: key,
      problem: p,
      headers: res.headers,
      body,
    };
    const msg = `${method} ${path} → ${res.status}${fields.code ? ` ${fields.code}` : ''}${fields.detail ? `: ${fields.detail}` : ''}`;
    if (res.status === 429) {
      const violated = p?.['violated-policies'];
      return new RateLimitError(msg, {
        ...fields,
        violatedPolicies: Array.isArray(violated) ? violated.filter((v): v is string => typeof v === 'string') : [],
        policy: bindingPolicy(res.headers),
        retryAfterMs: parseRetryAfter(res.headers.get('retry-after'), this.#clock.now()),
      });
    }
    if (fields.code === 'API_KEY_EXPIRED') return new ApiKeyExpiredError(msg, fields);
    return fields.code === 'IDEMPOTENCY_KEY_REUSE_CONFLICT' ? new IdempotencyKeyReuseError(msg, fields) : new ApiError(msg, fields);
  }

  private exhausted(method: string, path: string, attempts: number, key: string | undefined, last: PostguardError): RetriesExhaustedError {
    return new RetriesExhaustedError(`${method} ${path} failed after ${attempts} attempts: ${last.message}`, {
      status: last.status,
      code: last.code,
      detail: last.detail,
      requestId: last.requestId,
      problem: last.problem,
      attempts,
      idempotencyKey: key,
      cause: last,
    });
  }

  private url(path: string, query?: Record<string, QueryValue>): string {
    const p = path.startsWith('/') ? path : `/${path}`;
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(query ?? {})) if (v !== undefined && v !== null) q.append(k, String(v));
    const qs = q.toString();
    return `${this.baseUrl}${p}${qs ? (p.includes('?') ? '&' : '?') + qs : ''}`;
  }

  private headers(options: RequestOptions, key: string | undefined): Record<string, string> {
    const h: Record<string, string> = { accept: 'application/json, application/problem+json;q=0.9, */*;q=0.5' };
    const ua = this.#opts.userAgent ?? `postguard-client-typescript/${VERSION}`;
    if (ua !== false) h['user-agent'] = ua;
    Object.assign(h, this.#opts.headers, options.headers);
    // The call's key is set below, once: a key given as a header is not sent a second time.
    for (const name of Object.keys(h)) if (name.toLowerCase() === 'idempotency-key') delete h[name];
    const token = options.token ?? this.credential(options.auth ?? 'apiKey');
    if (token !== undefined) h.authorization = `Bearer ${token}`;
    if (key !== undefined) h['idempotency-key'] = key;
    return h;
  }

  private credential(kind: Credential): string | undefined {
    if (kind === 'none') return undefined;
    const token = kind === 'admin' ? this.#opts.adminToken : kind === 'origin' ? this.#opts.originToken : this.#opts.apiKey;
    if (token === undefined || token === '') {
      const opt = kind === 'admin' ? 'adminToken' : kind === 'origin' ? 'originToken' : 'apiKey';
      throw new ConfigurationError(`this call needs the client option ${opt} (it was ${token === undefined ? 'not given' : 'empty'})`);
    }
    return token;
  }
}
