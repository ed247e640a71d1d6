"""The gateway's own endpoints as :class:`Call` descriptions, shared by both clients
(which only add ``self._json(...)`` or ``await self._json(...)`` around them)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from ._http import Call, Params, make_call

V1 = "/_postguard/v1"


def _id(value: str) -> str:
    # An id goes into the path: percent-encode everything, a "/" included.
    return quote(value, safe="")


def _body(**fields: Any) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


def me() -> Call:
    return make_call("GET", f"{V1}/me")


# --- webhook subscriptions -------------------------------------------------------


def create_webhook(
    url: str, events: list[str], description: str | None, rate_limit_per_s: int | None
) -> Call:
    body = _body(url=url, events=events, description=description, rate_limit_per_s=rate_limit_per_s)
    return make_call("POST", f"{V1}/webhooks", json=body)


def list_webhooks(limit: int | None, cursor: str | None) -> Call:
    return make_call("GET", f"{V1}/webhooks", params={"limit": limit, "cursor": cursor})


def get_webhook(sub_id: str) -> Call:
    return make_call("GET", f"{V1}/webhooks/{_id(sub_id)}")


def update_webhook(sub_id: str, fields: dict[str, Any]) -> Call:
    return make_call("PATCH", f"{V1}/webhooks/{_id(sub_id)}", json=_body(**fields))


def delete_webhook(sub_id: str) -> Call:
    return make_call("DELETE", f"{V1}/webhooks/{_id(sub_id)}")


def webhook_action(sub_id: str, action: str, body: dict[str, Any] | None = None) -> Call:
    """``rotate-secret``, ``pause``, ``resume``, ``test``, ``recover``."""
    return make_call("POST", f"{V1}/webhooks/{_id(sub_id)}/{action}", json=body or {})


def get_task(task_id: str) -> Call:
    return make_call("GET", f"{V1}/tasks/{_id(task_id)}")


# --- deliveries, events ------------------------------------------------------------


def list_deliveries(filters: Params) -> Call:
    return make_call("GET", f"{V1}/deliveries", params=filters)


def get_delivery(delivery_id: str) -> Call:
    return make_call("GET", f"{V1}/deliveries/{_id(delivery_id)}")


def retry_delivery(delivery_id: str) -> Call:
    return make_call("POST", f"{V1}/deliveries/{_id(delivery_id)}/retry", json={})


def redirect_delivery(delivery_id: str, url: str) -> Call:
    return make_call("POST", f"{V1}/deliveries/{_id(delivery_id)}/redirect", json={"url": url})


def publish_event(project: str, type: str, data: Any, event_id: str | None) -> Call:
    body = _body(project=project, type=type, data={} if data is None else data, id=event_id)
    return make_call("POST", f"{V1}/events", auth="origin", json=body)


def list_events(filters: Params) -> Call:
    return make_call("GET", f"{V1}/events", params=filters)


# --- audit, stats ---------------------------------------------------------------------


def audit(filters: Params) -> Call:
    return make_call("GET", f"{V1}/audit", params=filters)


def stats(days: int | None) -> Call:
    return make_call("GET", f"{V1}/stats", params={"days": days})


# --- operator ---------------------------------------------------------------------------


def create_key(project: str, plan: str, name: str | None) -> Call:
    return make_call("POST", f"{V1}/keys", auth="admin", json=_body(project=project, plan=plan, name=name))


def list_keys(project: str | None) -> Call:
    return make_call("GET", f"{V1}/keys", auth="admin", params={"project": project})


def get_key(key_id: str) -> Call:
    return make_call("GET", f"{V1}/keys/{_id(key_id)}", auth="admin")


def revoke_key(key_id: str) -> Call:
    return make_call("DELETE", f"{V1}/keys/{_id(key_id)}", auth="admin")


def create_portal_link(project: str, ttl_s: int | None) -> Call:
    return make_call("POST", f"{V1}/portal-links", auth="admin", json=_body(project=project, ttl_s=ttl_s))


def with_cursor(call: Call, cursor: str | None) -> Call:
    """The same list call for the next page."""
    params = dict(call.params)
    if cursor is not None:
        params["cursor"] = cursor
    return Call(
        call.method, call.path, call.auth, params, call.content, dict(call.headers), None, call.timeout
    )
