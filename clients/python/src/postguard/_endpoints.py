"""The gateway's own endpoints as :class:`Call` descriptions, shared by both clients
(which only add ``self._json(...)`` or ``await self._json(...)`` around them).

Every mutating call gets its Idempotency-Key here, once (the caller's ``key`` or a new
UUIDv4): the gateway honours it on its own endpoints (docs/idempotency.md), so a retry after a
lost answer gets the stored answer, never a second key, subscription or rotation.
Publishing is keyed by its event id, generated here when the caller gives none."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal
from urllib.parse import quote

from . import errors
from ._http import Call, IdempotencyKey, Params, make_call
from .types import Granularity, ImportKey, KeyChanges, PlanOverrides

V1 = "/_postguard/v1"


def _id(value: str) -> str:
    # An id goes into the path: percent-encode everything, a "/" included.
    return quote(value, safe="")


def _body(**fields: Any) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


def me() -> Call:
    return make_call("GET", f"{V1}/me")


def key_segment(idempotency_key: str) -> str:
    """An Idempotency-Key as the lookup's path segment: percent-encoded (a "/" included),
    and ``.`` or ``..`` in the RFC 8941 string form (``".."``), which the gateway reads as
    the same key — URL parsers drop a ``.``/``..`` segment before it is sent."""
    if not isinstance(idempotency_key, str) or not idempotency_key:
        raise errors.ConfigurationError("status(): the Idempotency-Key is empty")
    if idempotency_key in (".", ".."):
        idempotency_key = f'"{idempotency_key}"'
    return quote(idempotency_key, safe="")


def idempotency_status(idempotency_key: str) -> Call:
    return make_call("GET", f"{V1}/idempotency/{key_segment(idempotency_key)}")


# --- webhook subscriptions -------------------------------------------------------


def create_webhook(
    url: str,
    events: list[str],
    description: str | None,
    rate_limit_per_s: int | None,
    key: IdempotencyKey = None,
    secret: str | None = None,
) -> Call:
    body = _body(
        url=url, events=events, description=description, rate_limit_per_s=rate_limit_per_s, secret=secret
    )
    return make_call("POST", f"{V1}/webhooks", json=body, idempotency_key=key)


def list_webhooks(limit: int | None, cursor: str | None) -> Call:
    return make_call("GET", f"{V1}/webhooks", params={"limit": limit, "cursor": cursor})


def get_webhook(sub_id: str) -> Call:
    return make_call("GET", f"{V1}/webhooks/{_id(sub_id)}")


def update_webhook(sub_id: str, fields: dict[str, Any], key: IdempotencyKey = None) -> Call:
    return make_call("PATCH", f"{V1}/webhooks/{_id(sub_id)}", json=_body(**fields), idempotency_key=key)


def delete_webhook(sub_id: str, key: IdempotencyKey = None) -> Call:
    return make_call("DELETE", f"{V1}/webhooks/{_id(sub_id)}", idempotency_key=key)


def webhook_action(
    sub_id: str, action: str, body: dict[str, Any] | None = None, key: IdempotencyKey = None
) -> Call:
    """``rotate-secret``, ``pause``, ``resume``, ``test``, ``recover``."""
    return make_call("POST", f"{V1}/webhooks/{_id(sub_id)}/{action}", json=body or {}, idempotency_key=key)


def get_task(task_id: str) -> Call:
    return make_call("GET", f"{V1}/tasks/{_id(task_id)}")


# --- deliveries, events ------------------------------------------------------------


def list_deliveries(filters: Params) -> Call:
    return make_call("GET", f"{V1}/deliveries", params=filters)


def get_delivery(delivery_id: str) -> Call:
    return make_call("GET", f"{V1}/deliveries/{_id(delivery_id)}")


def retry_delivery(delivery_id: str, key: IdempotencyKey = None) -> Call:
    return make_call("POST", f"{V1}/deliveries/{_id(delivery_id)}/retry", json={}, idempotency_key=key)


def redirect_delivery(delivery_id: str, url: str, key: IdempotencyKey = None) -> Call:
    path = f"{V1}/deliveries/{_id(delivery_id)}/redirect"
    return make_call("POST", path, json={"url": url}, idempotency_key=key)


def new_event_id() -> str:
    return f"evt_{uuid.uuid4().hex}"


def publish_event(
    project: str,
    type: str,
    data: Any,
    event_id: str | None,
    deliver_at: int | str | datetime | None = None,
    ordering_key: str | None = None,
) -> Call:
    """The event id is fixed here (``evt_<uuid>`` when not given), so that every attempt
    publishes the same event: the gateway treats a known id as a no-op. ``deliver_at``
    (scheduled event): no attempt before it, at most 7 days ahead. ``ordering_key``: per
    subscription, events with the same key are attempted in publish order."""
    body = {"project": project, "type": type, "data": {} if data is None else data}
    body["id"] = event_id or new_event_id()
    at = _time("deliver_at", deliver_at)
    if at is not None:
        body["deliver_at"] = at
    if ordering_key is not None:
        body["ordering_key"] = ordering_key
    return make_call("POST", f"{V1}/events", auth="origin", json=body)


def list_events(filters: Params) -> Call:
    return make_call("GET", f"{V1}/events", params=filters)


# --- audit, stats ---------------------------------------------------------------------


def audit(filters: Params) -> Call:
    return make_call("GET", f"{V1}/audit", params=filters)


def stats(days: int | None) -> Call:
    return make_call("GET", f"{V1}/stats", params={"days": days})


def usage(
    since: int | str | datetime | None,
    until: int | str | datetime | None,
    granularity: Granularity | None,
    project: str | None,
    auth: Literal["api_key", "admin"] | None,
) -> Call:
    """``GET /usage``: the API key's project, unless a project is named or ``auth`` is
    ``"admin"`` (the operator: one project, or every project)."""
    who: Literal["api_key", "admin"] = auth or ("admin" if project is not None else "api_key")
    params = {"since": _time("since", since), "until": _time("until", until)}
    params.update(granularity=granularity, project=project)
    return make_call("GET", f"{V1}/usage", auth=who, params=params)


# --- operator ---------------------------------------------------------------------------


def _time(name: str, value: int | str | datetime | None) -> int | str | None:
    """A time as the gateway takes it: epoch ms or RFC 3339; an aware datetime is turned
    into epoch ms (a naive one is refused: its time zone would be a guess)."""
    if not isinstance(value, datetime):
        return value
    if value.tzinfo is None:
        raise errors.ConfigurationError(f"{name}: give an aware datetime (with tzinfo)")
    return int(value.timestamp() * 1000)


def expiry(value: int | str | datetime | None) -> int | str | None:
    """``expires_at`` as the gateway takes it (see :func:`_time`)."""
    return _time("expires_at", value)


def create_key(
    project: str,
    plan: str,
    name: str | None,
    key: IdempotencyKey = None,
    *,
    expires_at: int | str | datetime | None = None,
    meta: dict[str, Any] | None = None,
    overrides: PlanOverrides | None = None,
) -> Call:
    body = _body(
        project=project, plan=plan, name=name, expires_at=expiry(expires_at), meta=meta, overrides=overrides
    )
    return make_call("POST", f"{V1}/keys", auth="admin", json=body, idempotency_key=key)


_IMPORT_FIELDS = frozenset(
    {"key", "sha256", "prefix", "project", "plan", "name", "meta", "expires_at", "overrides"}
)


def import_keys(keys: list[ImportKey], key: IdempotencyKey = None) -> Call:
    """``POST /keys/import``: the entries in the order given, each as the gateway takes
    it (an aware datetime ``expires_at`` as epoch ms). A member the API does not know is
    refused here, naming the entry as the gateway would (``keys[3].plann``)."""
    body: list[dict[str, Any]] = []
    for i, entry in enumerate(keys):
        unknown = sorted(set(entry) - _IMPORT_FIELDS)
        if unknown:
            raise errors.ConfigurationError(f"import_keys: keys[{i}].{unknown[0]} is not a field of a key")
        item: dict[str, Any] = dict(entry)
        if "expires_at" in item:
            item["expires_at"] = _time(f"keys[{i}].expires_at", item["expires_at"])
        body.append(item)
    return make_call("POST", f"{V1}/keys/import", auth="admin", json={"keys": body}, idempotency_key=key)


_KEY_CHANGES = frozenset({"name", "plan", "meta", "overrides", "expires_at"})


def update_key(key_id: str, changes: KeyChanges, key: IdempotencyKey = None) -> Call:
    """PATCH: each member given replaces the key's; ``None`` clears (it is sent as
    ``null``); a member left out is kept."""
    unknown = set(changes) - _KEY_CHANGES
    if unknown:
        raise errors.ConfigurationError(f"update_key: unknown fields {sorted(unknown)}")
    body: dict[str, Any] = dict(changes)
    if "expires_at" in body:
        body["expires_at"] = expiry(body["expires_at"])
    return make_call("PATCH", f"{V1}/keys/{_id(key_id)}", auth="admin", json=body, idempotency_key=key)


def reroll_key(key_id: str, grace_s: int | None, key: IdempotencyKey = None) -> Call:
    path = f"{V1}/keys/{_id(key_id)}/reroll"
    return make_call("POST", path, auth="admin", json=_body(grace_s=grace_s), idempotency_key=key)


def list_keys(project: str | None) -> Call:
    return make_call("GET", f"{V1}/keys", auth="admin", params={"project": project})


def get_key(key_id: str) -> Call:
    return make_call("GET", f"{V1}/keys/{_id(key_id)}", auth="admin")


def revoke_key(key_id: str, key: IdempotencyKey = None) -> Call:
    return make_call("DELETE", f"{V1}/keys/{_id(key_id)}", auth="admin", idempotency_key=key)


def create_portal_link(project: str, ttl_s: int | None, key: IdempotencyKey = None) -> Call:
    body = _body(project=project, ttl_s=ttl_s)
    return make_call("POST", f"{V1}/portal-links", auth="admin", json=body, idempotency_key=key)


def with_cursor(call: Call, cursor: str | None) -> Call:
    """The same list call for the next page."""
    params = dict(call.params)
    if cursor is not None:
        params["cursor"] = cursor
    return Call(
        call.method, call.path, call.auth, params, call.content, dict(call.headers), None, call.timeout
    )
