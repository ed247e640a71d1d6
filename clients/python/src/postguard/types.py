"""The gateway's resources as the contract names them (snake_case, epoch-ms times)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, TypedDict, TypeVar

T = TypeVar("T")


@dataclass
class Page(Generic[T]):
    """One page of a list: ``next_cursor`` is ``None`` on the last page."""

    data: list[T] = field(default_factory=list)
    next_cursor: str | None = None


class Me(TypedDict):
    prefix: str
    project: str
    plan: str
    limit: int
    remaining: int
    reset: int
    window_s: int


class ApiKey(TypedDict, total=False):
    id: str
    prefix: str
    project: str
    plan: str
    name: str | None
    created_at: int
    revoked_at: int | None
    #: Only in the answer to :meth:`Client.create_key`: shown once.
    key: str


class Subscription(TypedDict, total=False):
    id: str
    url: str
    events: list[str]
    description: str | None
    created_at: int
    state: str
    rate_limit_per_s: int | None
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
    deliveries: dict[str, int]


class AuditRow(TypedDict):
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


class StatsDay(TypedDict):
    date: str
    requests: int
    errors: int
    server_errors: int


class PathCount(TypedDict):
    path: str
    requests: int


class Stats(TypedDict, total=False):
    days: list[StatsDay]
    top_paths: list[PathCount]
    error_share: float
    p50_ms: float | None
    p95_ms: float | None


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
