"""The gateway's resources as the contract names them (snake_case, epoch-ms times)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, Literal, TypedDict, TypeVar

T = TypeVar("T")


@dataclass
class Page(Generic[T]):
    """One page of a list: ``next_cursor`` is ``None`` on the last page."""

    data: list[T] = field(default_factory=list)
    next_cursor: str | None = None


class PolicyState(TypedDict):
    """One policy's state now (``reset`` in epoch seconds)."""

    name: str
    limit: int
    remaining: int
    reset: int
    window_s: int


class Inflight(TypedDict, total=False):
    """The concurrency quota: requests of the key in flight at the origin, of ``limit``."""

    limit: int
    in_use: int
    refused: bool


class _MeFields(TypedDict):
    prefix: str
    project: str
    plan: str
    #: ``limit``, ``remaining``, ``reset`` (epoch seconds) and ``window_s`` are the
    #: binding policy's.
    limit: int
    remaining: int
    reset: int
    window_s: int


class Me(_MeFields, total=False):
    #: When the key stops working (epoch ms), or ``None``.
    expires_at: int | None
    #: Every policy of the key's plan.
    policies: list[PolicyState]
    inflight: Inflight


class PolicySpec(TypedDict):
    name: str
    requests: int
    window_s: int


class GatewaySpec(TypedDict, total=False):
    requests: int
    window_s: int


class PlanOverrides(TypedDict, total=False):
    """A key's replacements of its plan's numbers (docs/limits.md), e.g.
    ``{"requests_per_window": 7}`` or ``{"policies": [...], "concurrency": 2}``."""

    requests_per_window: int
    window_s: int
    policies: list[PolicySpec]
    concurrency: int
    gateway: GatewaySpec
    idempotency_ttl_s: int
    #: ``False``: report-only — every policy and the concurrency quota are counted and
    #: advertised, but a request they would refuse is forwarded (its audit row says
    #: ``would_refuse``).
    enforce: bool
    #: Quota notices: the percentages (1–100) of each policy's limit at which the event
    #: ``postguard.quota.threshold`` is published to the key's project, once per window
    #: and threshold.
    notify_at: list[int]


class ApiKey(TypedDict, total=False):
    id: str
    prefix: str
    project: str
    plan: str
    name: str | None
    created_at: int
    revoked_at: int | None
    #: Epoch ms, or ``None``: never.
    expires_at: int | None
    #: The operator's metadata, forwarded signed to the origin; ``None`` in lists.
    meta: dict[str, Any] | None
    #: ``None`` in lists (:meth:`Client.get_key` shows them).
    overrides: PlanOverrides | None
    #: When the operator last changed the key (epoch ms; 0: as created).
    updated_at: int
    #: Only in the answers to :meth:`Client.create_key` and :meth:`Client.reroll_key`:
    #: shown once.
    key: str
    #: Only from :meth:`Client.reroll_key`: the old secret works until then (epoch ms).
    previous_expires_at: int
    #: Only from :meth:`Client.get_key`: each policy's state now.
    policies: list[PolicyState]
    inflight: Inflight


class KeyChanges(TypedDict, total=False):
    """What :meth:`Client.update_key` changes: each member given replaces the key's;
    ``None`` clears ``name``, ``meta``, ``overrides`` or ``expires_at``; a member left out
    is kept. ``expires_at`` is epoch ms, RFC 3339 or an aware datetime."""

    name: str | None
    plan: str
    meta: dict[str, Any] | None
    overrides: PlanOverrides | None
    expires_at: int | str | datetime | None


class _ImportKeyFields(TypedDict):
    project: str
    plan: str


class ImportKey(_ImportKeyFields, total=False):
    """One key an API already issued (:meth:`Client.import_keys`): the key itself
    (``key``: 16–256 visible ASCII characters, any format; ``prefix`` defaults to its first
    12), or — when you do not want to send keys — ``sha256`` (the lowercase hex SHA-256 of
    its bytes) with the ``prefix`` logs and dashboards show (1–12 visible ASCII characters).
    The other members mean what they mean in :meth:`Client.create_key`."""

    key: str
    sha256: str
    prefix: str
    name: str | None
    #: Epoch ms, RFC 3339 or an aware datetime.
    expires_at: int | str | datetime | None
    meta: dict[str, Any] | None
    overrides: PlanOverrides | None


class ImportedKey(TypedDict):
    """One entry of the import's answer, in the order given. ``id`` is derived from the
    key's hash (the same key, the same id in every call); ``exists``: the key was known
    and is left unchanged, so an import can be re-run."""

    id: str
    prefix: str
    status: Literal["created", "exists"]


IdempotencyState = Literal["in_progress", "completed", "expired", "unknown"]


class _IdempotencyStatusFields(TypedDict):
    state: IdempotencyState


class IdempotencyStatus(_IdempotencyStatusFields, total=False):
    """What became of the request this API key sent under an Idempotency-Key
    (:meth:`Client.status`). ``in_progress``: it runs (``expires_at`` ends its lease);
    ``completed``: its answer is stored (``status``, ``request_id``) and a resend with the
    same key replays it until ``expires_at``; ``expired``: the record outlived its TTL or
    lease (a resend runs anew); ``unknown``: no record (it never arrived, or its answer
    was not kept — a 5xx or a timeout is not stored)."""

    status: int
    request_id: str
    #: Epoch ms: the claim (in progress) or the completion.
    created_at: int
    #: Epoch ms: the end of the lease (in progress) or of the TTL (completed).
    expires_at: int


class ReceiverLimit(TypedDict):
    remaining: int
    reset_at: int


class Subscription(TypedDict, total=False):
    id: str
    url: str
    events: list[str]
    description: str | None
    created_at: int
    state: str
    rate_limit_per_s: int | None
    #: What its receiver last advertised (RateLimit / X-RateLimit-*) while the reset is ahead:
    #: ``{"remaining": int, "reset_at": epoch ms}``, or None.
    receiver_limit: ReceiverLimit | None
    #: Only on create: shown once.
    secret: str


class SecretRotation(TypedDict):
    secret: str


class Attempt(TypedDict, total=False):
    attempt: int
    url: str
    status_code: int | None
    error: str | None
    response_excerpt: str | None
    duration_ms: int
    request_id: str
    at: int
    next_retry_at: int | None


class Delivery(TypedDict, total=False):
    id: str
    event_id: str
    event_type: str
    subscription_id: str
    url: str
    status: str
    attempts_made: int
    next_attempt_at: int | None
    created_at: int
    #: The event's ordering key; ``None`` without one.
    ordering_key: str | None
    #: The delivery (same subscription and ordering key) this one waits for before its first
    #: attempt; ``None`` when it is not waiting.
    blocked_by: str | None
    #: Only on :meth:`Client.get_delivery`.
    attempts: list[Attempt]


class PublishedEvent(TypedDict):
    id: str


class Event(TypedDict, total=False):
    id: str
    type: str
    timestamp: str
    data: Any
    request_id: str
    #: The ordering key it was published with; ``None`` without one.
    ordering_key: str | None
    deliveries: dict[str, int]


class _AuditRowFields(TypedDict):
    request_id: str
    time: int
    method: str
    path: str
    status: int
    response_bytes: int
    response_time_ms: int
    client_ip: str | None
    user_agent: str | None
    key_prefix: str | None
    project: str | None
    idempotency_key: str | None
    replayed: bool
    rate_limit_remaining: int | None


class AuditRow(_AuditRowFields, total=False):
    #: The origin a proxied request was routed to (``default`` or an ``origins`` name);
    #: ``None`` when not forwarded (and absent before gateway 0.4).
    origin: str | None
    #: Report-only limits: the policy (or ``inflight``) that would have refused this
    #: forwarded request.
    would_refuse: str | None


class StatsDay(TypedDict):
    date: str
    requests: int
    errors: int
    server_errors: int
    #: Proxied requests without an Idempotency-Key where the mode is ``required``:
    #: forwarded before ``idempotency.required_from``, refused after.
    missing_idempotency_key: int


class KeyMissingIdempotency(TypedDict):
    key_prefix: str
    requests: int


class PathCount(TypedDict):
    path: str
    requests: int


class Stats(TypedDict, total=False):
    days: list[StatsDay]
    top_paths: list[PathCount]
    error_share: float
    p50_ms: float | None
    p95_ms: float | None
    #: The keys that sent such requests in the period, most first: whom to tell.
    keys_missing_idempotency: list[KeyMissingIdempotency]


Granularity = Literal["hour", "day"]


class Usage(TypedDict):
    """One key's proxied requests in one period (:meth:`Client.usage`)."""

    key_prefix: str
    project: str
    #: The period's first millisecond (UTC, epoch ms).
    period_start: int
    #: Every request.
    requests: int
    #: Forwarded to the origin.
    admitted: int
    #: Each operation once: with an Idempotency-Key, the execution whose final answer was
    #: stored (never its replays, 409s or retries after a 5xx); without, forwarded and
    #: answered below 500.
    billable: int
    #: Stored answers replayed.
    replays: int
    #: 429s.
    refused: int


class PortalLink(TypedDict):
    url: str
    expires_at: int


class Task(TypedDict, total=False):
    id: str
    kind: str
    state: str
    total: int
    done: int
    failed: int


class WebhookTestResult(TypedDict, total=False):
    status_code: int | None
    duration_ms: int
    response_excerpt: str | None
    error: str | None
