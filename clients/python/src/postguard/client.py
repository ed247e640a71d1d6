"""The synchronous client (``httpx.Client``); safe to share between threads."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from typing import Any, Literal, cast, overload

import httpx

from . import _endpoints as ep
from . import errors
from . import operations as ops
from ._base import BaseClient
from ._http import (
    RETRYABLE_TRANSPORT_ERRORS,
    Auth,
    Call,
    IdempotencyKey,
    Params,
    Response,
    make_call,
    network_error,
)
from ._limiter import SyncLimiter
from .operations import Operation
from .types import (
    ApiKey,
    AuditRow,
    Delivery,
    Event,
    Granularity,
    IdempotencyStatus,
    ImportedKey,
    ImportKey,
    KeyChanges,
    Me,
    Page,
    PlanOverrides,
    PortalLink,
    PublishedEvent,
    SecretRotation,
    Stats,
    Subscription,
    Task,
    Usage,
    WebhookTestResult,
)


class Client(BaseClient):
    """A postguard client. One instance per process (or per API key) is the
    intended use: its limiter is the one budget all its threads share.

    Takes every keyword of :class:`postguard._base.BaseClient`, plus ``transport``
    (an ``httpx.BaseTransport``, e.g. for tests) or a ready ``http_client``.
    """

    def __init__(
        self,
        base_url: str,
        *,
        transport: httpx.BaseTransport | None = None,
        http_client: httpx.Client | None = None,
        _sleep: Callable[[float], None] | None = None,
        **settings: Any,
    ) -> None:
        super().__init__(base_url, **settings)
        self._owns_http = http_client is None
        self._http = http_client or httpx.Client(transport=transport, timeout=self.timeout)
        self._limiter = SyncLimiter(self.throttle, self._monotonic)
        self._sleep = _sleep or time.sleep

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the retry loop ------------------------------------------------------------------

    def _attempt(self, call: Call, attempt: int) -> tuple[httpx.Response | None, Exception | None]:
        throttled = self._throttled(call)
        request = self._request(self._http, call)
        if throttled:
            self._limiter.acquire()
        raw: httpx.Response | None = None
        try:
            raw = self._http.send(request)
            return raw, None
        except RETRYABLE_TRANSPORT_ERRORS as err:
            return None, err
        except httpx.TransportError as err:  # e.g. an unsupported scheme: no retry can help
            raise network_error(err, call, attempt) from err
        finally:
            if throttled:
                self._limiter.release(self._rate_info(raw))

    def _send(self, call: Call) -> Response:
        attempt = 0
        while True:
            attempt += 1
            raw, err = self._attempt(call, attempt)
            decision = self._decide(call, attempt, raw, err)
            if not decision.retry:
                return self._result(call, raw, err, attempt)
            self._sleep(decision.delay_s)

    def _json(self, call: Call) -> Any:
        return self._send(call).json()

    def _page(self, call: Call) -> Page[Any]:
        body = self._json(call) or {}
        return Page(list(body.get("data", [])), body.get("next_cursor"))

    def _iterate(self, call: Call) -> Iterator[Any]:
        page = self._page(call)
        while True:
            yield from page.data
            if not page.next_cursor:
                return
            page = self._page(ep.with_cursor(call, page.next_cursor))

    # -- the generic call ------------------------------------------------------------------

    @overload
    def request(
        self,
        method: str,
        path: str,
        json: Any = None,
        *,
        content: bytes | str | None = None,
        headers: Mapping[str, str] | None = None,
        params: Params | None = None,
        idempotency_key: IdempotencyKey = None,
        timeout: float | httpx.Timeout | None = None,
        auth: Auth = "api_key",
        async_: Literal[False] = False,
    ) -> Response: ...

    @overload
    def request(
        self,
        method: str,
        path: str,
        json: Any = None,
        *,
        content: bytes | str | None = None,
        headers: Mapping[str, str] | None = None,
        params: Params | None = None,
        idempotency_key: IdempotencyKey = None,
        timeout: float | httpx.Timeout | None = None,
        auth: Auth = "api_key",
        async_: Literal[True],
    ) -> Operation: ...

    def request(
        self,
        method: str,
        path: str,
        json: Any = None,
        *,
        content: bytes | str | None = None,
        headers: Mapping[str, str] | None = None,
        params: Params | None = None,
        idempotency_key: IdempotencyKey = None,
        timeout: float | httpx.Timeout | None = None,
        auth: Auth = "api_key",
        async_: bool = False,
    ) -> Response | Operation:
        """Any call through the gateway, e.g. the origin's own API. A mutating method
        gets one Idempotency-Key (``idempotency_key`` or a new UUIDv4) for all its
        attempts; ``idempotency_key=False`` sends none, and then a lost answer is not
        retried (the request may have run). Raises a :class:`postguard.PostguardError`
        subclass for status ≥ 400.

        ``async_=True`` asks the gateway to run it as an asynchronous operation
        (``Prefer: respond-async``, on the routes its operator named) and returns an
        :class:`Operation` at once, whose ``wait()`` returns the result; it always
        carries an Idempotency-Key (``False`` is refused)."""
        if async_ and idempotency_key is False:
            raise errors.ConfigurationError("an asynchronous call needs an Idempotency-Key")
        call = make_call(
            method,
            path,
            auth=auth,
            json=json,
            content=content,
            headers=ops.with_preference(headers) if async_ else headers,
            params=params,
            idempotency_key=idempotency_key,
            timeout=timeout,
        )
        if async_ and call.idempotency_key is None:
            call.idempotency_key = str(uuid.uuid4())
        resp = self._send(call)
        if not async_:
            return resp
        if ops.is_accepted(resp):
            info = cast(ops.OperationInfo, resp.json())
            return Operation(self._send, info, call.idempotency_key)
        return Operation(self._send, None, call.idempotency_key, resp)

    def operation(self, operation_id: str) -> Operation:
        """The handle of an existing operation by its id (e.g. one stored before a restart)."""
        info = cast(ops.OperationInfo, (self._send(ops.get_call(operation_id))).json())
        return Operation(self._send, info, None)

    def get_operation(self, operation_id: str) -> ops.OperationInfo:
        """``GET /operations/{id}``: an operation of the project (any key of it may read it)."""
        return cast(ops.OperationInfo, self._json(ops.get_call(operation_id)))

    def list_operations(self, **filters: str | int | None) -> Page[ops.OperationInfo]:
        """One page of the project's operations, newest first. Filters: ``state``,
        ``limit``, ``cursor``."""
        return self._page(ops.list_call(filters))

    # -- the key's own endpoints -------------------------------------------------------------

    def me(self) -> Me:
        return cast(Me, self._json(ep.me()))

    def status(self, idempotency_key: str) -> IdempotencyStatus:
        """What became of the request this API key sent under ``idempotency_key``
        (``GET /idempotency/{key}``, free of budget): ``state`` is ``completed`` (send it
        again with the same key: the stored answer is replayed), ``in_progress`` (wait and
        ask again), ``expired`` or ``unknown`` (nothing is kept: sending it again runs it)."""
        return cast(IdempotencyStatus, self._json(ep.idempotency_status(idempotency_key)))

    def create_webhook(
        self,
        url: str,
        events: list[str],
        *,
        description: str | None = None,
        rate_limit_per_s: int | None = None,
        secret: str | None = None,
        idempotency_key: IdempotencyKey = None,
    ) -> Subscription:
        """A subscription; its ``secret`` (``whsec_…``) is in this answer only. A
        subscription moved from another system keeps its secret: pass it as ``secret``
        (``whsec_`` + the standard base64 of 24–64 bytes) and deliveries are signed with it."""
        call = ep.create_webhook(url, events, description, rate_limit_per_s, idempotency_key, secret)
        return cast(Subscription, self._json(call))

    def list_webhooks(self, *, limit: int | None = None, cursor: str | None = None) -> Page[Subscription]:
        return self._page(ep.list_webhooks(limit, cursor))

    def get_webhook(self, subscription_id: str) -> Subscription:
        return cast(Subscription, self._json(ep.get_webhook(subscription_id)))

    def update_webhook(
        self, subscription_id: str, *, idempotency_key: IdempotencyKey = None, **fields: Any
    ) -> Subscription:
        """PATCH ``url``, ``events``, ``description`` or ``rate_limit_per_s``."""
        call = ep.update_webhook(subscription_id, fields, idempotency_key)
        return cast(Subscription, self._json(call))

    def delete_webhook(self, subscription_id: str, *, idempotency_key: IdempotencyKey = None) -> None:
        self._send(ep.delete_webhook(subscription_id, idempotency_key))

    def rotate_webhook_secret(
        self, subscription_id: str, *, idempotency_key: IdempotencyKey = None
    ) -> SecretRotation:
        """A new secret; the old one keeps signing alongside it for 24 h."""
        call = ep.webhook_action(subscription_id, "rotate-secret", key=idempotency_key)
        return cast(SecretRotation, self._json(call))

    def pause_webhook(self, subscription_id: str, *, idempotency_key: IdempotencyKey = None) -> Subscription:
        call = ep.webhook_action(subscription_id, "pause", key=idempotency_key)
        return cast(Subscription, self._json(call))

    def resume_webhook(self, subscription_id: str, *, idempotency_key: IdempotencyKey = None) -> Subscription:
        call = ep.webhook_action(subscription_id, "resume", key=idempotency_key)
        return cast(Subscription, self._json(call))

    def test_webhook(
        self, subscription_id: str, *, idempotency_key: IdempotencyKey = None
    ) -> WebhookTestResult:
        call = ep.webhook_action(subscription_id, "test", key=idempotency_key)
        return cast(WebhookTestResult, self._json(call))

    def recover_webhook(
        self,
        subscription_id: str,
        *,
        since: int | str,
        until: int | str | None = None,
        idempotency_key: IdempotencyKey = None,
    ) -> Task:
        body = {"since": since, **({"until": until} if until is not None else {})}
        call = ep.webhook_action(subscription_id, "recover", body, idempotency_key)
        return cast(Task, self._json(call))

    def get_task(self, task_id: str) -> Task:
        return cast(Task, self._json(ep.get_task(task_id)))

    def list_deliveries(self, **filters: str | int | None) -> Page[Delivery]:
        """Filters: ``status``, ``event_type``, ``since``, ``limit``, ``cursor``."""
        return self._page(ep.list_deliveries(filters))

    def iter_deliveries(self, **filters: str | int | None) -> Iterator[Delivery]:
        return self._iterate(ep.list_deliveries(filters))

    def get_delivery(self, delivery_id: str) -> Delivery:
        return cast(Delivery, self._json(ep.get_delivery(delivery_id)))

    def retry_delivery(self, delivery_id: str, *, idempotency_key: IdempotencyKey = None) -> Any:
        """One more attempt now (202), numbered after the last one."""
        return self._json(ep.retry_delivery(delivery_id, idempotency_key))

    def redirect_delivery(self, delivery_id: str, url: str, *, idempotency_key: IdempotencyKey = None) -> Any:
        """Send the event once to ``url`` (202); the delivery's receiver and status stay."""
        return self._json(ep.redirect_delivery(delivery_id, url, idempotency_key))

    def list_events(self, **filters: str | int | None) -> Page[Event]:
        """Filters: ``since``, ``until``, ``type``, ``order``, ``limit``, ``cursor``."""
        return self._page(ep.list_events(filters))

    def audit(self, **filters: str | int | None) -> Page[AuditRow]:
        """One page of the audit log. Filters: ``request_id``, ``method``, ``status``
        (``200``, ``4xx``…), ``path`` (``*`` wildcard), ``idempotency_key``,
        ``since``/``until``, ``limit``, ``cursor``."""
        return self._page(ep.audit(filters))

    def iter_audit(self, **filters: str | int | None) -> Iterator[AuditRow]:
        """Every matching audit row, newest first, following the cursor."""
        return self._iterate(ep.audit(filters))

    def stats(self, *, days: int | None = None) -> Stats:
        return cast(Stats, self._json(ep.stats(days)))

    def usage(
        self,
        *,
        since: int | str | datetime | None = None,
        until: int | str | datetime | None = None,
        granularity: Granularity | None = None,
        project: str | None = None,
        auth: Literal["api_key", "admin"] | None = None,
    ) -> list[Usage]:
        """``GET /usage``: per key and ``hour`` or ``day`` (default), its proxied requests —
        all, forwarded, billable (each operation once: never a replay, a 409 or a retry
        after a 5xx), replays and 429s — oldest period first; default the last 7 days
        (``since``/``until``: epoch ms, RFC 3339 or an aware datetime). With the API key:
        its project. As the operator: ``project`` names one (and implies
        ``auth="admin"``); ``auth="admin"`` without it reads every project. The counts come
        from the audit log, written just after each answer."""
        call = ep.usage(since, until, granularity, project, auth)
        return list((self._json(call) or {}).get("data", []))

    # -- the origin ----------------------------------------------------------------------------

    def publish_event(
        self,
        project: str,
        type: str,
        data: Any = None,
        *,
        event_id: str | None = None,
        deliver_at: int | str | datetime | None = None,
        ordering_key: str | None = None,
    ) -> PublishedEvent:
        """Publish as the origin (``origin_token``); the gateway fans it out. Without an
        ``event_id`` one is generated (``evt_…``) and kept for every attempt, so a
        retried publish is the same event, never a second one. ``deliver_at`` (epoch ms,
        RFC 3339 or an aware datetime, at most 7 days ahead): no attempt before it.
        ``ordering_key`` (1-128 visible ASCII): per subscription, events with the same key are
        attempted in publish order, each waiting until the one before it is delivered or
        dead-lettered; other keys and events without one go in parallel."""
        call = ep.publish_event(project, type, data, event_id, deliver_at, ordering_key)
        return cast(PublishedEvent, self._json(call))

    # -- the operator ----------------------------------------------------------------------------

    def create_key(
        self,
        project: str,
        plan: str,
        *,
        name: str | None = None,
        expires_at: int | str | datetime | None = None,
        meta: dict[str, Any] | None = None,
        overrides: PlanOverrides | None = None,
        idempotency_key: IdempotencyKey = None,
    ) -> ApiKey:
        """A new API key (``key`` is shown once). ``expires_at``: epoch ms, RFC 3339 or an
        aware datetime; ``meta``: a JSON object (≤ 1 KiB) forwarded signed to the origin;
        ``overrides``: replacements of the plan's numbers for this key."""
        call = ep.create_key(
            project, plan, name, idempotency_key, expires_at=expires_at, meta=meta, overrides=overrides
        )
        return cast(ApiKey, self._json(call))

    def import_keys(
        self, keys: list[ImportKey], *, idempotency_key: IdempotencyKey = None
    ) -> list[ImportedKey]:
        """``POST /keys/import``: 1–1,000 keys the API already issued (``key``, or
        ``sha256`` with ``prefix``; ``project``, ``plan`` and optionally ``name``, ``meta``,
        ``expires_at``, ``overrides``), usable from the answer on. The whole call is
        validated first: one invalid entry raises :class:`ValidationError` naming it
        (``keys[3].plan``) and nothing is imported. Each entry's ``status`` is ``created``,
        or ``exists`` when the key was known (left unchanged): a re-run is safe, and the
        call's retries carry one Idempotency-Key like every mutating call."""
        call = ep.import_keys(keys, idempotency_key)
        return list((self._json(call) or {}).get("data", []))

    def update_key(
        self, key_id: str, changes: KeyChanges, *, idempotency_key: IdempotencyKey = None
    ) -> ApiKey:
        """PATCH ``name``, ``plan``, ``meta``, ``overrides`` or ``expires_at``: a member
        given replaces the key's, ``None`` clears it, one left out is kept. Applies from
        the key's next request."""
        return cast(ApiKey, self._json(ep.update_key(key_id, changes, idempotency_key)))

    def reroll_key(
        self, key_id: str, *, grace_s: int | None = None, idempotency_key: IdempotencyKey = None
    ) -> ApiKey:
        """A new secret for the same key (id, prefix, counters): ``key`` (shown once) and
        ``previous_expires_at`` — the old secret works until then (``grace_s``, default
        24 h, at most 7 days)."""
        return cast(ApiKey, self._json(ep.reroll_key(key_id, grace_s, idempotency_key)))

    def list_keys(self, *, project: str | None = None) -> Page[ApiKey]:
        return self._page(ep.list_keys(project))

    def get_key(self, key_id: str) -> ApiKey:
        return cast(ApiKey, self._json(ep.get_key(key_id)))

    def revoke_key(self, key_id: str, *, idempotency_key: IdempotencyKey = None) -> None:
        self._send(ep.revoke_key(key_id, idempotency_key))

    def create_portal_link(
        self, project: str, *, ttl_s: int | None = None, idempotency_key: IdempotencyKey = None
    ) -> PortalLink:
        return cast(PortalLink, self._json(ep.create_portal_link(project, ttl_s, idempotency_key)))
