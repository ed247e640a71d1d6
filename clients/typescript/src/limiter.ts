import type { Clock } from './clock.js';
import type { RateLimitInfo } from './ratelimit-headers.js';

export interface ThrottleOptions {
  /** Wait before sending when the budget runs low (default true). `false`: send at once, absorb 429s. */
  enabled?: boolean;
  /**
   * Budget kept in reserve: a call is sent only if at least `threshold` units remain after it
   * (0 uses the whole budget). Capped at limit − 1 so a small plan still moves. Default: a
   * tenth of the limit the gateway advertises, at least 1 (see `reserveFor`).
   */
  threshold?: number;
  /** Spread calls evenly over the window (window / limit apart) instead of sending in bursts. */
  pacing?: boolean;
}

/** The current window as far as responses tell: its reset lies within (low, high]. */
interface Window {
  remaining: number;
  low: number;
  high: number;
}

/**
 * Where the reset of a response's window can lie, in client time. postguard's `t` is the time
 * to the reset rounded up, measured when the server handled the request — between sending and
 * receiving — so the reset is after `sentAt + (t − 1) s` and at or before `receivedAt + t s`.
 */
function bounds(info: RateLimitInfo, sentAt: number, receivedAt: number): { low: number; high: number } | undefined {
  if (info.resetInS !== undefined) {
    return { low: sentAt + (info.resetInS - 1) * 1000, high: receivedAt + info.resetInS * 1000 };
  }
  if (info.resetEpochS !== undefined) {
    // Absolute server time: trust the client clock to be close (documented).
    return { low: (info.resetEpochS - 1) * 1000, high: info.resetEpochS * 1000 };
  }
  return undefined;
}

/** The default reserve's share of the plan's limit. */
const RESERVE_SHARE = 0.1;

/**
 * The budget kept in reserve on a plan of `limit` per window: `threshold` when given, else a
 * tenth of the limit rounded down and at least 1 (for other processes sharing the key) — and
 * never the whole budget: at most limit − 1, so every window admits at least one call.
 */
export function reserveFor(limit: number, threshold?: number): number {
  const wanted = threshold === undefined ? Math.max(1, Math.floor(limit * RESERVE_SHARE)) : Math.max(0, Math.floor(threshold));
  return Math.min(wanted, Math.max(0, limit - 1));
}

/** Margin after the latest possible reset before sending into the next window. */
const RESET_MARGIN_MS = 20;
/**
 * How long calls wait for the first answer to tell the budget; with pacing, also the spacing of
 * calls sent while it has not (there is no window to pace by yet).
 */
const PROBE_WAIT_MS = 1000;

/**
 * One limiter per client instance, shared by all its concurrent calls (the "central counter" for
 * workers in one process). It admits a call when the budget the last responses reported, minus
 * the calls still in flight (which may already have used it), keeps the reserve (`reserveFor`);
 * else the call waits for the window's reset or for an in-flight answer, whichever comes first.
 */
export class RateLimiter {
  private readonly enabled: boolean;
  private readonly threshold: number | undefined;
  private readonly pacing: boolean;
  private limit: number | undefined;
  private windowMs: number | undefined;
  private window: Window | undefined;
  /** The window we rolled past: late answers from it must not be taken for the new one. */
  private stale: Window | undefined;
  private inFlight = 0;
  private lastSendAt = Number.NEGATIVE_INFINITY;
  private probeSentAt = 0;
  private readonly waiters = new Set<() => void>();

  constructor(
    options: ThrottleOptions,
    private readonly clock: Clock,
  ) {
    this.enabled = options.enabled ?? true;
    this.threshold = options.threshold;
    this.pacing = options.pacing ?? false;
  }

  /** Calls sent and not yet answered. */
  get pending(): number {
    return this.inFlight;
  }

  /** Wait until a call may be sent, then count it in flight. */
  async acquire(signal?: AbortSignal): Promise<void> {
    for (;;) {
      signal?.throwIfAborted();
      const wait = this.enabled ? this.delayBeforeSend(this.clock.now()) : 0;
      if (wait === 0) {
        if (this.limit === undefined && this.inFlight === 0) this.probeSentAt = this.clock.now();
        this.inFlight += 1;
        this.lastSendAt = this.clock.now();
        return;
      }
      await this.waitForChange(wait, signal);
    }
  }

  /** A call was answered (`info` from its headers) or failed without an answer (`info` undefined). */
  release(info: RateLimitInfo | undefined, sentAt: number, receivedAt: number, answered: boolean): void {
    this.inFlight = Math.max(0, this.inFlight - 1);
    if (info) this.observe(info, sentAt, receivedAt);
    else if (!answered && this.window) {
      // Lost answer: the request may well have been admitted and used a unit.
      this.window.remaining = Math.max(0, this.window.remaining - 1);
    }
    this.notify();
  }

  /** 0 to send now, else how long to wait (Infinity: until an answer arrives). */
  delayBeforeSend(now: number): number {
    this.roll(now);
    if (this.limit === undefined) return this.delayWhileUnknown(now);
    const reserve = reserveFor(this.limit, this.threshold);
    const remaining = this.window?.remaining ?? this.limit;
    if (remaining - this.inFlight - 1 < reserve) {
      if (this.window) return Math.max(1, this.window.high + RESET_MARGIN_MS - now);
      if (this.inFlight > 0) return Number.POSITIVE_INFINITY; // an answer will tell
      // Nothing in flight, no window (a plan of 0): only trying can tell more.
    }
    if (this.pacing && this.windowMs !== undefined && this.limit > 0) {
      const next = this.lastSendAt + this.windowMs / this.limit;
      if (now < next) return next - now;
    }
    return 0;
  }

  /**
   * Budget unknown: one call probes it; the others wait for its answer, but not for a slow
   * origin — after PROBE_WAIT_MS they go (the budget is then unlikely to be the bottleneck).
   * With pacing they go one per PROBE_WAIT_MS, not all at once: a slow answer must not turn
   * paced calls into a burst.
   */
  private delayWhileUnknown(now: number): number {
    if (this.inFlight === 0) return 0;
    const probeWait = this.probeSentAt + PROBE_WAIT_MS - now;
    if (probeWait > 0 || !this.pacing) return Math.max(0, probeWait);
    return Math.max(0, this.lastSendAt + PROBE_WAIT_MS - now);
  }

  private roll(now: number): void {
    if (this.window && now >= this.window.high + RESET_MARGIN_MS) {
      this.stale = this.window;
      this.window = undefined; // a fresh window: the whole limit, minus what is in flight
    }
  }

  private observe(info: RateLimitInfo, sentAt: number, receivedAt: number): void {
    if (info.limit !== undefined) this.limit = info.limit;
    if (info.windowS !== undefined) this.windowMs = info.windowS * 1000;
    this.limit ??= info.remaining + 1; // no limit header: at least what remains plus this call
    const b = bounds(info, sentAt, receivedAt);
    if (!b) return;
    const next: Window = { remaining: info.remaining, ...b };
    const cur = this.window;
    if (!cur) {
      if (this.stale && b.low < this.stale.high && b.high > this.stale.low) return; // a late answer from the old window
      this.window = next;
    } else if (b.low >= cur.high) {
      this.stale = cur;
      this.window = next; // a later window
    } else if (b.high > cur.low) {
      cur.remaining = Math.min(cur.remaining, info.remaining);
      cur.low = Math.max(cur.low, b.low);
      cur.high = Math.min(cur.high, b.high);
    } // else: an earlier window's answer, arriving late
  }

  private waitForChange(ms: number, signal?: AbortSignal): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      const timer = Number.isFinite(ms) ? new AbortController() : undefined;
      const done = () => {
        this.waiters.delete(done);
        signal?.removeEventListener('abort', onAbort);
        timer?.abort();
        resolve();
      };
      const onAbort = () => {
        this.waiters.delete(done);
        timer?.abort();
        reject(signal?.reason);
      };
      this.waiters.add(done);
      signal?.addEventListener('abort', onAbort, { once: true });
      if (timer) this.clock.sleep(ms, timer.signal).then(done, () => {});
    });
  }

  private notify(): void {
    for (const w of [...this.waiters]) w();
  }
}
