"""What the sync and async clients share: the description of one logical call, the
headers of its attempts, the answer object, and the error an answer turns into."""

from __future__ import annotations

import json as jsonlib
import platform
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from . import errors
from ._core import MUTATING_METHODS, Outcome, parse_retry_after, replay_safe
from ._response import Response as Response  # re-exported: the transport answers with it
from ._version import __version__

Auth = Literal["api_key", "admin", "origin", "none"]
Params = Mapping[str, "str | int | float | bool | None"]
#: A caller's Idempotency-Key: their own, ``None`` (one is generated for a mutating
#: method) or ``False`` (send none: a mutating call is then not retried after a lost
#: answer, since it may have run).
IdempotencyKey = str | None | Literal[False]

USER_AGENT = (
    f"postguard-python/{__version__} httpx/{httpx.__version__} "
    f"{platform.python_implementation().lower()}/{platform.python_version()}"
)

#: Transport failures after which the request may or may not have been executed:
#: retried (with the same Idempotency-Key, so at most one execution happens).
RETRYABLE_TRANSPORT_ERRORS: tuple[type[Exception], ...] = (
    httpx.TimeoutException,
    httpx.NetworkError,
    httpx.RemoteProtocolError,
)


@dataclass
class Call:
    """One logical operation: every attempt sends exactly these bytes and headers."""

    method: str
    path: str
    auth: Auth = "api_key"
    params: dict[str, str] = field(default_factory=dict)
    content: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    idempotency_key: str | None = None
    timeout: float | httpx.Timeout | None = None

    @property
    def replay_safe(self) -> bool:
        """Whether a lost answer may be retried (see :func:`postguard._core.replay_safe`)."""
        return replay_safe(self.method, self.idempotency_key)


def make_call(
    method: str,
    path: str,
    *,
    auth: Auth = "api_key",
    json: Any = None,
    content: bytes | str | None = None,
    headers: Mapping[str, str] | None = None,
    params: Params | None = None,
    idempotency_key: IdempotencyKey = None,
    timeout: float | httpx.Timeout | None = None,
) -> Call:
    """Fix the call once: the body is encoded here, and a mutating method gets its
    Idempotency-Key here (the caller's or a new UUIDv4), never per attempt;
    ``idempotency_key=False`` sends none."""
    method = method.upper()
    if not path.startswith("/"):
        raise errors.ConfigurationError(f"path must start with '/': {path!r}")
    hdrs = {k.lower(): v for k, v in (headers or {}).items()}
    body: bytes | None = None
    if json is not None and content is not None:
        raise errors.ConfigurationError("give either json or content, not both")
    if json is not None:
        body = jsonlib.dumps(json, separators=(",", ":"), ensure_ascii=False).encode()
        hdrs.setdefault("content-type", "application/json")
    elif content is not None:
        body = content.encode() if isinstance(content, str) else content
    header_key = hdrs.pop("idempotency-key", None)
    key: str | None = None
    if idempotency_key is not False:
        key = idempotency_key or header_key
        if key is None and method in MUTATING_METHODS:
            key = str(uuid.uuid4())
    clean = {k: _param(v) for k, v in (params or {}).items() if v is not None}
    return Call(method, path, auth, clean, body, hdrs, key, timeout)


def _param(v: str | int | float | bool) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


@dataclass(frozen=True)
class AttemptInfo:
    """Given to the ``on_attempt`` hook after every attempt: answered (``status``,
    ``headers``) or not (``error``). Counting the 429s a client saw is
    ``status == 429``. ``retry_in_s`` is the wait planned before the next attempt, or
    ``None`` when this attempt ends the call."""

    method: str
    path: str
    attempt: int
    idempotency_key: str | None
    status: int | None
    headers: httpx.Headers | None
    error: Exception | None
    retry_in_s: float | None = None


AttemptHook = Callable[[AttemptInfo], None]


def problem_of(raw: httpx.Response) -> dict[str, Any] | None:
    """The problem+json body of an error answer, when it is one."""
    ctype = raw.headers.get("content-type", "")
    if "json" not in ctype:
        return None
    try:
        body = raw.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) and isinstance(body.get("code"), str) else None


def outcome_of(raw: httpx.Response | None, now_epoch_s: float) -> Outcome:
    if raw is None:
        return Outcome(status=None)
    code = None
    if raw.status_code >= 400:
        p = problem_of(raw)
        code = p["code"] if p else None
    return Outcome(raw.status_code, code, parse_retry_after(raw.headers.get("retry-after"), now_epoch_s))


def error_from(raw: httpx.Response, call: Call, attempts: int) -> errors.ApiError:
    """The typed error for an error answer; the problem's fields when there is one."""
    p = problem_of(raw)
    code = p.get("code") if p else None
    cls = errors.error_class(raw.status_code, code)
    if p is not None:
        detail = str(p.get("detail") or p.get("title") or f"HTTP {raw.status_code}")
    else:
        detail = f"HTTP {raw.status_code} {raw.reason_phrase}".strip()
    request_id = (p.get("request_id") if p else None) or raw.headers.get("x-request-id")
    return cls(
        detail,
        code=code if code else (cls.default_code if cls is not errors.ApiError else "HTTP_ERROR"),
        status=raw.status_code,
        request_id=request_id,
        title=p.get("title") if p else None,
        type=p.get("type") if p else None,
        attempts=attempts,
        idempotency_key=call.idempotency_key,
        response=Response(raw, attempts=attempts, idempotency_key=call.idempotency_key),
        problem=p,
    )


def network_error(err: Exception, call: Call, attempts: int) -> errors.NetworkError:
    kind = type(err).__name__
    return errors.NetworkError(
        f"{call.method} {call.path}: no answer after {attempts} attempt(s) ({kind}: {err})",
        attempts=attempts,
        idempotency_key=call.idempotency_key,
    )
