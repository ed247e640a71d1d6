"""Verifying postguard's webhook deliveries (Standard Webhooks) and deduplicating them.

The signature check is the PyPI ``standardwebhooks`` library's ``Webhook.verify``;
this module adds what a receiver needs around it: several secrets (during a rotation
the gateway signs with the old and the new secret for 24 h), a tolerance tighter than
the library's fixed 5 minutes, a typed event, and a dedupe hook — delivery is at least
once, so the same event id can arrive twice.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import standardwebhooks

from .errors import (
    ConfigurationError,
    WebhookBodyInvalid,
    WebhookHeadersMissing,
    WebhookSignatureInvalid,
    WebhookTimestampOutOfTolerance,
)

#: The library's own window, which it applies whatever we ask: a tolerance can only
#: tighten it.
LIBRARY_TOLERANCE_S = 300

#: ``dedupe(event_id)`` → ``True`` the first time an id is seen (and remembers it),
#: ``False`` for a repeat. Back it with your database (an insert on a unique column)
#: to dedupe across processes; :class:`MemoryDedupe` serves a single process.
DedupeHook = Callable[[str], bool]


@dataclass(frozen=True)
class WebhookEvent:
    """A verified delivery. ``duplicate`` is ``True`` when the dedupe hook had already
    seen this id: answer 2xx (so the gateway stops retrying) and skip the work."""

    id: str
    type: str
    timestamp: str
    data: Any
    duplicate: bool
    raw: dict[str, Any]


class MemoryDedupe:
    """An in-process dedupe hook: the last ``max_entries`` ids seen within ``ttl_s``
    (default 3 days: longer than the gateway's ~25 h retry schedule). Thread-safe."""

    def __init__(
        self,
        max_entries: int = 100_000,
        ttl_s: float = 3 * 86_400,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._seen: OrderedDict[str, float] = OrderedDict()
        self._max = max_entries
        self._ttl = ttl_s
        self._clock = clock
        self._lock = threading.Lock()

    def __call__(self, event_id: str) -> bool:
        now = self._clock()
        with self._lock:
            # Insertion order is time order: expired and surplus ids are at the front.
            while self._seen and next(iter(self._seen.values())) <= now - self._ttl:
                self._seen.popitem(last=False)
            if event_id in self._seen:
                return False
            while len(self._seen) >= self._max:
                self._seen.popitem(last=False)
            self._seen[event_id] = now
            return True


def _secrets(secrets: str | Sequence[str]) -> list[standardwebhooks.Webhook]:
    items = [secrets] if isinstance(secrets, str) else list(secrets)
    if not items:
        raise ConfigurationError("verify needs at least one webhook secret")
    try:
        return [standardwebhooks.Webhook(s) for s in items]
    except Exception as err:  # binascii.Error, or the library's EmptyWebhookSecretError (a bare Exception)
        raise ConfigurationError(
            f"a webhook secret is not a whsec_<base64> secret ({type(err).__name__})"
        ) from None


_SIGNED_HEADERS = ("webhook-id", "webhook-timestamp", "webhook-signature")


def _check_headers(headers: Mapping[str, str]) -> None:
    missing = [k for k in _SIGNED_HEADERS if not headers.get(k)]
    if missing:
        raise WebhookHeadersMissing(f"missing {', '.join(missing)}")
    if not headers["webhook-timestamp"].isdigit():
        raise WebhookHeadersMissing("webhook-timestamp is not unix seconds")


def _check_timestamp(headers: Mapping[str, str], tolerance_s: float, now: float) -> None:
    sent = int(headers["webhook-timestamp"])
    if abs(now - sent) > tolerance_s:
        when = "old" if sent < now else "in the future"
        raise WebhookTimestampOutOfTolerance(
            f"webhook-timestamp is {when}: more than {tolerance_s:g} s away from now"
        )


def _library_error(err: Exception) -> WebhookSignatureInvalid | WebhookTimestampOutOfTolerance:
    """The library's one exception type, told apart by its message: its own ±5-minute
    window (which uses the real clock even when ``now`` is given) or a bad signature."""
    if "timestamp too" in str(err):
        return WebhookTimestampOutOfTolerance(f"webhook-timestamp refused by the library: {err}")
    return WebhookSignatureInvalid("no signature matches any of the given secrets")


def verify(
    body: bytes | str,
    headers: Mapping[str, str],
    secrets: str | Sequence[str],
    *,
    tolerance_s: float = LIBRARY_TOLERANCE_S,
    dedupe: DedupeHook | None = None,
    now: float | None = None,
) -> WebhookEvent:
    """Verify one delivery and return its event.

    :param body: the raw request body, exactly as received (bytes, or the str of it).
    :param headers: the request headers (any case); ``webhook-id``,
        ``webhook-timestamp`` and ``webhook-signature`` are used.
    :param secrets: the subscription's ``whsec_...`` secret, or several (rotation):
        the delivery verifies when any of them signed it.
    :param tolerance_s: the largest allowed distance between the delivery's timestamp
        and ``now`` (at most 300 s, the library's own window).
    :param dedupe: called with the event id once the signature holds (never before,
        so forged deliveries cannot fill it); see :data:`DedupeHook`.
    :param now: unix seconds to check the timestamp against (tests); the library
        still applies its 5-minute window to the real clock.
    :raises WebhookVerificationError: one of its subclasses —
        :class:`~postguard.WebhookHeadersMissing` (a ``webhook-*`` header missing or
        malformed), :class:`~postguard.WebhookTimestampOutOfTolerance` (stale or future),
        :class:`~postguard.WebhookSignatureInvalid` (no matching signature),
        :class:`~postguard.WebhookBodyInvalid` (signed, but not a JSON event).
    """
    if not 0 < tolerance_s <= LIBRARY_TOLERANCE_S:
        raise ConfigurationError(f"tolerance_s must be within (0, {LIBRARY_TOLERANCE_S}]")
    hooks = _secrets(secrets)
    h = {k.lower(): v for k, v in headers.items()}
    _check_headers(h)
    _check_timestamp(h, tolerance_s, time.time() if now is None else now)
    signed: dict[str, str] = {k: h[k] for k in _SIGNED_HEADERS}
    refused: Exception | None = None
    for hook in hooks:
        try:
            hook.verify(body, signed, json_parse=False)
            break
        except (standardwebhooks.WebhookVerificationError, ValueError) as err:
            # ValueError: a malformed signature list or non-UTF-8 body, refused alike.
            refused = err
    else:
        raise _library_error(refused or ValueError()) from None
    return _event(body, signed["webhook-id"], dedupe)


def _event(body: bytes | str, event_id: str, dedupe: DedupeHook | None) -> WebhookEvent:
    try:
        raw = json.loads(body)
    except ValueError:
        raise WebhookBodyInvalid("the signed body is not JSON") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
        raise WebhookBodyInvalid("the signed body is not an event")
    duplicate = dedupe is not None and not dedupe(event_id)
    return WebhookEvent(
        id=event_id,
        type=raw["type"],
        timestamp=str(raw.get("timestamp", "")),
        data=raw.get("data"),
        duplicate=duplicate,
        raw=raw,
    )
