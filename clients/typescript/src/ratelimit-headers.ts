/** What one response says about the key's budget, read from the headers postguard sends. */
export interface RateLimitInfo {
  limit?: number;
  remaining: number;
  /** Seconds until the window resets, relative to the response (IETF `t`), when known. */
  resetInS?: number;
  /** Unix seconds of the reset (`X-RateLimit-Reset`), when known. */
  resetEpochS?: number;
  /** Window length in seconds (IETF `RateLimit-Policy` `w`), when known. */
  windowS?: number;
}

interface HeaderSource {
  get(name: string): string | null;
}

const int = (v: string | null | undefined): number | undefined =>
  v !== null && v !== undefined && /^\s*\d+\s*$/.test(v) ? Number(v) : undefined;

/**
 * One parameter of the first item of an RFC 8941 list such as `"default";r=47;t=13`.
 * Only the first policy is read: postguard sends one.
 */
function param(field: string | null, name: string): number | undefined {
  if (!field) return undefined;
  const first = field.split(',')[0] ?? '';
  for (const part of first.split(';').slice(1)) {
    const [k, v] = part.split('=');
    if (k?.trim() === name) return int(v);
  }
  return undefined;
}

/** Undefined when the response carries no budget (e.g. a 401 before authentication). */
export function readRateLimit(headers: HeaderSource): RateLimitInfo | undefined {
  const rl = headers.get('ratelimit');
  const policy = headers.get('ratelimit-policy');
  const remaining = param(rl, 'r') ?? int(headers.get('x-ratelimit-remaining'));
  if (remaining === undefined) return undefined;
  return {
    remaining,
    limit: param(policy, 'q') ?? int(headers.get('x-ratelimit-limit')),
    resetInS: param(rl, 't'),
    resetEpochS: int(headers.get('x-ratelimit-reset')),
    windowS: param(policy, 'w'),
  };
}
