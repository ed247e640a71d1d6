import { Webhook, WebhookVerificationError as LibVerificationError } from 'standardwebhooks';
import { ConfigurationError, WebhookVerificationError } from './errors.js';
import type { WebhookEvent } from './types.js';

/** The Standard Webhooks library refuses timestamps more than 5 minutes away; a tolerance can only be stricter. */
export const MAX_TOLERANCE_S = 300;

export type HeaderInput = Headers | Record<string, string | string[] | undefined>;

export interface VerifyOptions {
  /** Refuse deliveries whose `webhook-timestamp` is further than this from now (s, default and max 300). */
  toleranceS?: number;
  /** Clock for the tolerance check (ms since the epoch). */
  now?: () => number;
}

function header(headers: HeaderInput, name: string): string | undefined {
  if (typeof (headers as Headers).get === 'function') return (headers as Headers).get(name) ?? undefined;
  const rec = headers as Record<string, string | string[] | undefined>;
  const key = Object.keys(rec).find((k) => k.toLowerCase() === name);
  const v = key === undefined ? undefined : rec[key];
  return Array.isArray(v) ? v.join(' ') : v;
}

const decoder = new TextDecoder('utf-8', { fatal: true });

function bodyText(body: string | Uint8Array | ArrayBuffer): string {
  if (typeof body === 'string') return body;
  try {
    return decoder.decode(body instanceof ArrayBuffer ? new Uint8Array(body) : body);
  } catch {
    throw new WebhookVerificationError('webhook body is not UTF-8', { code: 'WEBHOOK_BODY_INVALID' });
  }
}

/**
 * Verify a delivery with the Standard Webhooks library against one or more secrets (during a
 * rotation the gateway signs with the old and the new; any one that matches accepts). Pass the
 * body exactly as received — not re-serialised JSON. Returns the parsed event; throws
 * WebhookVerificationError (`code` WEBHOOK_SIGNATURE_INVALID, WEBHOOK_TIMESTAMP_OUT_OF_TOLERANCE,
 * WEBHOOK_HEADERS_MISSING, WEBHOOK_BODY_INVALID).
 */
export function verifyWebhook<T = unknown>(
  body: string | Uint8Array | ArrayBuffer,
  headers: HeaderInput,
  secrets: string | readonly string[],
  options: VerifyOptions = {},
): WebhookEvent<T> {
  const list = typeof secrets === 'string' ? [secrets] : [...secrets];
  if (list.length === 0) throw new ConfigurationError('verifyWebhook: at least one secret is required');
  const h = {
    'webhook-id': header(headers, 'webhook-id') ?? '',
    'webhook-timestamp': header(headers, 'webhook-timestamp') ?? '',
    'webhook-signature': header(headers, 'webhook-signature') ?? '',
  };
  if (!h['webhook-id'] || !h['webhook-timestamp'] || !h['webhook-signature']) {
    throw new WebhookVerificationError('webhook-id, webhook-timestamp or webhook-signature missing', { code: 'WEBHOOK_HEADERS_MISSING' });
  }
  checkTimestamp(h['webhook-timestamp'], options);
  const text = bodyText(body);
  let lastError: unknown;
  for (const secret of list) {
    try {
      return new Webhook(secret).verify(text, h) as WebhookEvent<T>;
    } catch (e) {
      if (!(e instanceof LibVerificationError)) {
        // A secret the library cannot use (empty, not base64) is a configuration error, not a bad delivery.
        if (!(e instanceof SyntaxError)) throw e;
        throw new WebhookVerificationError('signature verified, body is not JSON', { code: 'WEBHOOK_BODY_INVALID', cause: e });
      }
      lastError = e;
    }
  }
  throw new WebhookVerificationError('no signature matches any of the secrets', { code: 'WEBHOOK_SIGNATURE_INVALID', cause: lastError });
}

function checkTimestamp(value: string, options: VerifyOptions): void {
  const tolerance = Math.min(options.toleranceS ?? MAX_TOLERANCE_S, MAX_TOLERANCE_S);
  const ts = /^\d+$/.test(value) ? Number(value) : Number.NaN;
  const nowS = Math.floor((options.now ?? Date.now)() / 1000);
  if (!Number.isFinite(ts) || Math.abs(nowS - ts) > tolerance) {
    throw new WebhookVerificationError(`webhook-timestamp is not within ${tolerance} s of now`, { code: 'WEBHOOK_TIMESTAMP_OUT_OF_TOLERANCE' });
  }
}

/**
 * The dedupe hook: deliveries are at least once, so the same event id can arrive again (a retry
 * after a lost 2xx, a manual retry). `claim` returns true the first time an id is seen and marks
 * it; `release` forgets it again so that a delivery whose handler failed is processed on retry.
 * Back it with your store (a unique index, Redis SET NX, KV) in production.
 */
export interface DedupeStore {
  claim(eventId: string): boolean | Promise<boolean>;
  release?(eventId: string): void | Promise<void>;
}

/** An in-process DedupeStore remembering ids for `ttlMs` (default 25 h: the gateway's retry horizon), at most `maxEntries`. */
export class MemoryDedupeStore implements DedupeStore {
  private readonly seen = new Map<string, number>();
  private readonly ttlMs: number;
  private readonly maxEntries: number;
  private readonly now: () => number;

  constructor(options: { ttlMs?: number; maxEntries?: number; now?: () => number } = {}) {
    this.ttlMs = options.ttlMs ?? 25 * 3600 * 1000;
    this.maxEntries = options.maxEntries ?? 100_000;
    this.now = options.now ?? Date.now;
  }

  claim(eventId: string): boolean {
    const now = this.now();
    const at = this.seen.get(eventId);
    if (at !== undefined && now - at < this.ttlMs) return false;
    this.seen.delete(eventId);
    this.seen.set(eventId, now);
    // Map keeps insertion order: the oldest entries go first.
    for (const [id, t] of this.seen) {
      if (this.seen.size <= this.maxEntries && now - t < this.ttlMs) break;
      this.seen.delete(id);
    }
    return true;
  }

  release(eventId: string): void {
    this.seen.delete(eventId);
  }
}

export interface ReceiverOptions extends VerifyOptions {
  secrets: string | readonly string[];
  /** Default: a MemoryDedupeStore. */
  dedupe?: DedupeStore;
}

export interface Received<T> {
  event: WebhookEvent<T>;
  /** true when this event id was already handled: answer 2xx and do nothing. */
  duplicate: boolean;
}

/** Verify, then dedupe by event id, then run the handler (released from the store if it throws). */
export class WebhookReceiver {
  private readonly dedupe: DedupeStore;

  constructor(private readonly options: ReceiverOptions) {
    this.dedupe = options.dedupe ?? new MemoryDedupeStore({ now: options.now });
  }

  async receive<T = unknown>(
    body: string | Uint8Array | ArrayBuffer,
    headers: HeaderInput,
    handler?: (event: WebhookEvent<T>) => unknown | Promise<unknown>,
  ): Promise<Received<T>> {
    const event = verifyWebhook<T>(body, headers, this.options.secrets, this.options);
    if (!(await this.dedupe.claim(event.id))) return { event, duplicate: true };
    try {
      await handler?.(event);
    } catch (e) {
      await this.dedupe.release?.(event.id);
      throw e;
    }
    return { event, duplicate: false };
  }
}
