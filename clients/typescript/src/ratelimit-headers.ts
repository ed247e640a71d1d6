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

/** The members of an RFC 8941 list such as `"burst";r=3;t=1, "minute";r=47;t=13`: name and integer parameters. */
function members(field: string | null): { name: string; params: Map<string, number | undefined> }[] {
  if (!field) return [];
  return field.split(',').map((member) => {
    const [name = '', ...rest] = member.split(';');
    const params = new Map<string, number | undefined>();
    for (const part of rest) {
      const [k, v] = part.split('=');
      if (k) params.set(k.trim(), int(v));
    }
    return { name: name.trim().replace(/^"|"$/g, ''), params };
  });
}

/**
 * The policy that binds: of the `RateLimit` members with both `r` and `t` (time windows; a
 * concurrency quota has no `t`), the one with the fewest remaining — postguard lists it first.
 */
function binding(field: string | null): { name: string; r: number; t: number } | undefined {
  let best: { name: string; r: number; t: number } | undefined;
  for (const m of members(field)) {
    const r = m.params.get('r');
    const t = m.params.get('t');
    if (r !== undefined && t !== undefined && (best === undefined || r < best.r)) best = { name: m.name, r, t };
  }
  return best;
}

/** Undefined when the response carries no budget (e.g. a 401 before authentication). */
export function readRateLimit(headers: HeaderSource): RateLimitInfo | undefined {
  const bind = binding(headers.get('ratelimit'));
  // Limit and window of the same policy, by name (the policy list is in configuration order).
  const policy = members(headers.get('ratelimit-policy')).find((p) => p.name === bind?.name)?.params;
  const remaining = bind?.r ?? int(headers.get('x-ratelimit-remaining'));
  if (remaining === undefined) return undefined;
  return {
    remaining,
    limit: policy?.get('q') ?? int(headers.get('x-ratelimit-limit')),
    resetInS: bind?.t,
    resetEpochS: int(headers.get('x-ratelimit-reset')),
    windowS: policy?.get('w'),
  };
}
