import { PostguardClient, uuidv4, type ClientOptions, type QueryValue, type RequestOptions } from './client.js';
import { ConfigurationError } from './errors.js';
import type { OperationInfo, OperationState } from './operation.js';
import type {
  ApiKey, ApiKeyDetail, AuditQuery, AuditRow, CreatedApiKey, CreatedSubscription, CreateKeyInput, Delivery,
  DeliveryDetail, DeliveryQuery, EventQuery, EventRow, IdempotencyStatus, ImportedKey, ImportKeyInput, Inspector,
  InspectedRequest, Me, Page, PageQuery, PortalLink, PublishInput, RerolledApiKey, Stats, Subscription,
  SubscriptionInput, Task, TestResult, UpdateKeyInput, Usage, UsageQuery,
} from './types.js';

/** Per-call options of the typed methods. */
export type CallOptions = Pick<RequestOptions, 'signal' | 'timeoutMs' | 'maxAttempts' | 'idempotencyKey'>;

/** `usage()`'s options: whose usage — the API key's project (default) or, as the operator, any. */
export type UsageOptions = CallOptions & { auth?: 'apiKey' | 'admin' };

const V1 = '/_postguard/v1';
const seg = (id: string) => encodeURIComponent(id);
const q = (o: object | undefined) => o as Record<string, QueryValue> | undefined;

/**
 * An Idempotency-Key as the lookup's path segment: percent-encoded (a `/` included), and `.` or
 * `..` in the RFC 8941 string form (`".."`), which the gateway reads as the same key — URL
 * parsers remove a `.`/`..` segment, `%2E` spellings included, before it is sent.
 */
export function idempotencyKeySegment(key: string): string {
  if (typeof key !== 'string' || key.length === 0) throw new ConfigurationError('status(): the Idempotency-Key is empty');
  return encodeURIComponent(/^\.{1,2}$/.test(key) ? `"${key}"` : key);
}

/**
 * The gateway's own endpoints, typed, on top of `request()`. Every mutating call carries one
 * Idempotency-Key for all its attempts (`idempotencyKey` in the options to give your own), and
 * the gateway honours it on its own endpoints (docs/idempotency.md): a retry after a lost answer gets
 * the stored answer — one subscription, key, rotation, link, inspector, retry or redirect per
 * call, never two. `events.publish` is keyed by its event id instead.
 */
export class Postguard extends PostguardClient {
  constructor(options: ClientOptions) {
    super(options);
  }

  private async call<T>(method: string, path: string, o: RequestOptions & CallOptions = {}): Promise<T> {
    return (await this.request<T>(method, path, o)).data;
  }

  /** `GET /me`: the key's prefix, project, plan and current limit state (costs no budget). */
  me(o?: CallOptions): Promise<Me> {
    return this.call('GET', `${V1}/me`, o);
  }

  /**
   * `GET /idempotency/{key}`: did the request this API key sent under `idempotencyKey` run?
   * Costs no budget. `completed` → send it again with the same key to get the stored answer
   * (a replay); `in_progress` → wait and ask again; `unknown` or `expired` → nothing is kept for
   * the key: sending it again runs it (see the README's recipe).
   */
  status(idempotencyKey: string, o?: CallOptions): Promise<IdempotencyStatus> {
    return this.call('GET', `${V1}/idempotency/${idempotencyKeySegment(idempotencyKey)}`, o);
  }

  readonly operations = {
    /** `GET /operations/{id}`: an asynchronous operation of the project (any key of it may read it). */
    get: (id: string, o?: CallOptions): Promise<OperationInfo> => this.call('GET', `${V1}/operations/${seg(id)}`, o),
    /** One page of the project's operations, newest first (`state` filters). */
    list: (query: PageQuery & { state?: OperationState } = {}, o?: CallOptions): Promise<Page<OperationInfo>> =>
      this.call('GET', `${V1}/operations`, { ...o, query: q(query) }),
  };

  /** `GET /stats?days=`: per-day requests and errors, top paths, error share, latency. */
  stats(query: { days?: number } = {}, o?: CallOptions): Promise<Stats> {
    return this.call('GET', `${V1}/stats`, { ...o, query: q(query) });
  }

  /**
   * `GET /usage`: per key and hour or day, its proxied requests — all, forwarded, billable (each
   * operation once: never a replay, a 409 or a retry after a 5xx), replays and 429s — oldest
   * period first. With the API key: its project. As the operator (`adminToken`): `project` names
   * one, and `{ auth: 'admin' }` without it reads every project; naming a project implies it.
   * The counts come from the audit log, written just after each answer.
   */
  async usage(query: UsageQuery = {}, o: UsageOptions = {}): Promise<Usage[]> {
    const auth = o.auth ?? (query.project !== undefined ? 'admin' : 'apiKey');
    return (await this.call<{ data: Usage[] }>('GET', `${V1}/usage`, { ...o, auth, query: q(query) })).data;
  }

  /** Every page of a list endpoint, following `next_cursor`. */
  async *pages<T>(path: string, query: object = {}, o: RequestOptions = {}): AsyncGenerator<Page<T>> {
    let cursor: string | undefined;
    do {
      const page = await this.call<Page<T>>('GET', path, { ...o, query: { ...q(query), cursor } });
      yield page;
      cursor = page.next_cursor ?? undefined;
    } while (cursor);
  }

  /** Every item of a list endpoint, across pages. */
  async *items<T>(path: string, query: object = {}, o: RequestOptions = {}): AsyncGenerator<T> {
    for await (const page of this.pages<T>(path, query, o)) yield* page.data;
  }

  readonly audit = {
    /** One page of audit rows (own project; the operator sees all with `auth: 'admin'`). */
    list: (query: AuditQuery = {}, o?: CallOptions): Promise<Page<AuditRow>> => this.call('GET', `${V1}/audit`, { ...o, query: q(query) }),
    /** `for await (const row of client.audit.iterate({ status: '5xx' }))` — every row, page after page. */
    iterate: (query: AuditQuery = {}, o?: CallOptions): AsyncGenerator<AuditRow> => this.items<AuditRow>(`${V1}/audit`, query, o),
    pages: (query: AuditQuery = {}, o?: CallOptions): AsyncGenerator<Page<AuditRow>> => this.pages<AuditRow>(`${V1}/audit`, query, o),
  };

  readonly webhooks = {
    create: (input: SubscriptionInput, o?: CallOptions): Promise<CreatedSubscription> =>
      this.call('POST', `${V1}/webhooks`, { ...o, body: input }),
    list: (query: PageQuery = {}, o?: CallOptions): Promise<Page<Subscription>> => this.call('GET', `${V1}/webhooks`, { ...o, query: q(query) }),
    get: (id: string, o?: CallOptions): Promise<Subscription> => this.call('GET', `${V1}/webhooks/${seg(id)}`, o),
    update: (id: string, patch: Partial<SubscriptionInput>, o?: CallOptions): Promise<Subscription> =>
      this.call('PATCH', `${V1}/webhooks/${seg(id)}`, { ...o, body: patch }),
    delete: async (id: string, o?: CallOptions): Promise<void> => {
      await this.call('DELETE', `${V1}/webhooks/${seg(id)}`, o);
    },
    /** A new secret; the old one keeps signing alongside it for 24 h. */
    rotateSecret: (id: string, o?: CallOptions): Promise<{ secret: string }> =>
      this.call('POST', `${V1}/webhooks/${seg(id)}/rotate-secret`, o),
    pause: (id: string, o?: CallOptions): Promise<Subscription> => this.call('POST', `${V1}/webhooks/${seg(id)}/pause`, o),
    resume: (id: string, o?: CallOptions): Promise<Subscription> => this.call('POST', `${V1}/webhooks/${seg(id)}/resume`, o),
    /** Sends one signed `postguard.ping` and reports how the receiver answered. */
    test: (id: string, o?: CallOptions): Promise<TestResult> => this.call('POST', `${V1}/webhooks/${seg(id)}/test`, o),
    recover: (id: string, range: { since: number | string; until?: number | string }, o?: CallOptions): Promise<{ id: string }> =>
      this.call('POST', `${V1}/webhooks/${seg(id)}/recover`, { ...o, body: range }),
  };

  readonly deliveries = {
    list: (query: DeliveryQuery = {}, o?: CallOptions): Promise<Page<Delivery>> => this.call('GET', `${V1}/deliveries`, { ...o, query: q(query) }),
    iterate: (query: DeliveryQuery = {}, o?: CallOptions): AsyncGenerator<Delivery> => this.items<Delivery>(`${V1}/deliveries`, query, o),
    get: (id: string, o?: CallOptions): Promise<DeliveryDetail> => this.call('GET', `${V1}/deliveries/${seg(id)}`, o),
    retry: (id: string, o?: CallOptions): Promise<unknown> => this.call('POST', `${V1}/deliveries/${seg(id)}/retry`, o),
    redirect: (id: string, url: string, o?: CallOptions): Promise<unknown> =>
      this.call('POST', `${V1}/deliveries/${seg(id)}/redirect`, { ...o, body: { url } }),
  };

  readonly events = {
    /**
     * Publish as the origin (`originToken`). The event id is generated here when absent, so a
     * retried publish is a no-op at the gateway rather than a second event (the id is the
     * publish's natural key; the gateway does not key `POST /events` by Idempotency-Key).
     */
    publish: async (input: PublishInput, o?: CallOptions): Promise<{ id: string }> => {
      const id = input.id ?? `evt_${(await uuidv4()).replace(/-/g, '')}`;
      return this.call('POST', `${V1}/events`, { ...o, auth: 'origin', body: { ...input, id } });
    },
    list: (query: EventQuery = {}, o?: CallOptions): Promise<Page<EventRow>> => this.call('GET', `${V1}/events`, { ...o, query: q(query) }),
    iterate: (query: EventQuery = {}, o?: CallOptions): AsyncGenerator<EventRow> => this.items<EventRow>(`${V1}/events`, query, o),
  };

  readonly tasks = {
    get: (id: string, o?: CallOptions): Promise<Task> => this.call('GET', `${V1}/tasks/${seg(id)}`, o),
  };

  readonly inspectors = {
    create: (o?: CallOptions): Promise<Inspector> => this.call('POST', `${V1}/inspectors`, o),
    requests: (id: string, query: PageQuery = {}, o?: CallOptions): Promise<Page<InspectedRequest>> =>
      this.call('GET', `${V1}/inspectors/${seg(id)}/requests`, { ...o, query: q(query) }),
  };

  /** Operator endpoints (`adminToken`). */
  readonly keys = {
    /** A new key (`key` shown once), optionally with `expires_at`, `meta` and `overrides`. */
    create: (input: CreateKeyInput, o?: CallOptions): Promise<CreatedApiKey> =>
      this.call('POST', `${V1}/keys`, { ...o, auth: 'admin', body: input }),
    /**
     * `POST /keys/import`: 1–1,000 keys the API already issued (the key, or its SHA-256 with a
     * prefix), usable from the answer on. Validated whole first — one invalid entry is a 400
     * naming it (`keys[3].plan`) and nothing is imported. Each entry's `status` is `created`, or
     * `exists` when the key was known (left unchanged): a re-run is safe, and one call's retries
     * carry one Idempotency-Key like any mutating call.
     */
    import: async (keys: ImportKeyInput[], o?: CallOptions): Promise<ImportedKey[]> =>
      (await this.call<{ data: ImportedKey[] }>('POST', `${V1}/keys/import`, { ...o, auth: 'admin', body: { keys } })).data,
    list: (query: { project?: string } & PageQuery = {}, o?: CallOptions): Promise<Page<ApiKey>> =>
      this.call('GET', `${V1}/keys`, { ...o, auth: 'admin', query: q(query) }),
    /** One key with its metadata, overrides and the state of each of its policies. */
    get: (id: string, o?: CallOptions): Promise<ApiKeyDetail> => this.call('GET', `${V1}/keys/${seg(id)}`, { ...o, auth: 'admin' }),
    /** `PATCH`: name, plan, meta, overrides, expiry (`null` clears one); applies from the key's next request. */
    update: (id: string, patch: UpdateKeyInput, o?: CallOptions): Promise<ApiKey> =>
      this.call('PATCH', `${V1}/keys/${seg(id)}`, { ...o, auth: 'admin', body: patch }),
    /**
     * A new secret for the same key (id, prefix, counters); the old secret keeps working for
     * `grace_s` (default 24 h, at most 7 days), until `previous_expires_at`.
     */
    reroll: (id: string, input: { grace_s?: number } = {}, o?: CallOptions): Promise<RerolledApiKey> =>
      this.call('POST', `${V1}/keys/${seg(id)}/reroll`, { ...o, auth: 'admin', body: input }),
    revoke: async (id: string, o?: CallOptions): Promise<void> => {
      await this.call('DELETE', `${V1}/keys/${seg(id)}`, { ...o, auth: 'admin' });
    },
  };

  /** Operator: a signed link opening the dashboard for one project (default 1 h, at most 24 h). */
  readonly portalLinks = {
    create: (input: { project: string; ttl_s?: number }, o?: CallOptions): Promise<PortalLink> =>
      this.call('POST', `${V1}/portal-links`, { ...o, auth: 'admin', body: input }),
  };
}
