"""Asynchronous operations (``request(..., async_=True)``): the gateway stored the
request and answered 202 with its ``Location``; it runs once, from a queue. The
handle's ``wait()`` polls it — each poll after the ``Retry-After`` the gateway sent —
and returns its result. Sending the same request again with the same
Idempotency-Key gives back the same operation.

On a route the gateway does not run asynchronously the answer comes at once: the
handle is then done already (``id`` is ``None``) and ``wait()`` returns that answer.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal, TypedDict, cast
from urllib.parse import quote

from . import errors
from ._core import parse_retry_after
from ._http import Call, make_call
from ._response import Response

OperationState = Literal["queued", "running", "succeeded", "failed"]

#: Where a project's operations are read.
OPERATIONS = "/_postguard/v1/operations/"


class OperationInfo(TypedDict, total=False):
    """``GET /_postguard/v1/operations/{id}``."""

    id: str
    state: OperationState
    #: The kept answer's status, once done (absent when no attempt got an answer).
    status: int
    #: The request that created it: the 202's ``X-Request-Id``.
    request_id: str
    created_at: int
    completed_at: int
    method: str
    path: str
    attempts: int
    #: Why a ``failed`` operation has no answer it keeps (``key_revoked``, ``not_kept``…).
    reason: Literal[
        "timeout", "unreachable", "not_kept", "attempts_spent", "body_missing", "key_revoked", "key_expired"
    ]


class OperationFailed(errors.ApiError):
    """A ``failed`` operation: the origin could not be reached, or answered 5xx,
    through the whole retry schedule. ``status`` and ``response`` are the
    operation's last answer (or the gateway's 502 ``ORIGIN_UNREACHABLE`` problem
    when no attempt got one)."""

    default_code = "OPERATION_FAILED"


class OperationWaitTimeout(errors.PostguardError):
    """``wait(timeout=…)`` ran out while the operation was still queued or running."""

    default_code = "OPERATION_WAIT_TIMEOUT"


def with_preference(headers: Mapping[str, str] | None) -> dict[str, str]:
    """The call's headers with ``Prefer: respond-async`` (other preferences kept)."""
    out = {k.lower(): v for k, v in (headers or {}).items()}
    given = out.get("prefer")
    out["prefer"] = f"respond-async, {given}" if given else "respond-async"
    return out


def is_accepted(resp: Response) -> bool:
    """A 202 naming an operation (not an origin's own 202)."""
    location = str(resp.headers.get("location", ""))
    return resp.status == 202 and location.startswith(OPERATIONS)


def get_call(operation_id: str) -> Call:
    return make_call("GET", f"{OPERATIONS}{quote(operation_id, safe='')}")


def result_call(operation_id: str, *, failed: bool) -> Call:
    call = make_call("GET", f"{OPERATIONS}{quote(operation_id, safe='')}/result")
    # A failed operation's answer is a 5xx that is not retried as if it were lost.
    call.max_attempts = 1 if failed else None
    return call


def list_call(filters: Mapping[str, str | int | None]) -> Call:
    return make_call("GET", OPERATIONS.rstrip("/"), params=dict(filters))


def pause_s(retry_after: str | None, min_s: float, max_s: float, left_s: float) -> float:
    """How long to wait before the next poll: the answer's ``Retry-After``, within
    ``[min_s, max_s]`` and never past the caller's deadline."""
    given = parse_retry_after(retry_after, time.time())
    return max(0.0, min(max(given if given is not None else min_s, min_s), max_s, left_s))


def failed_error(op_id: str, info: OperationInfo, err: errors.ApiError) -> OperationFailed:
    return OperationFailed(
        f"operation {op_id} failed: {err.detail}",
        code=err.code,
        status=err.status,
        request_id=info.get("request_id"),
        attempts=err.attempts,
        idempotency_key=err.idempotency_key,
        response=err.response,
        problem=err.problem,
    )


class _Handle:
    """What the sync and async handles share."""

    def __init__(
        self, info: OperationInfo | None, idempotency_key: str | None, answered: Response | None
    ) -> None:
        #: What the gateway last said about the operation (``None`` for a synchronous answer).
        self.info = info
        #: The operation's id (``op_…``); ``None`` when the gateway answered synchronously.
        self.id: str | None = info.get("id") if info else None
        #: Its ``Location``: ``/_postguard/v1/operations/{id}``.
        self.location: str | None = f"{OPERATIONS}{self.id}" if self.id else None
        self.idempotency_key = idempotency_key
        self._answered = answered

    @property
    def state(self) -> OperationState:
        return self.info.get("state", "queued") if self.info else "succeeded"

    @property
    def done(self) -> bool:
        return self.state in ("succeeded", "failed")

    def __repr__(self) -> str:
        return f"<postguard.Operation {self.id} {self.state}>"


class Operation(_Handle):
    """An operation of :class:`postguard.Client`."""

    def __init__(
        self,
        send: Callable[[Call], Response],
        info: OperationInfo | None,
        idempotency_key: str | None,
        answered: Response | None = None,
    ) -> None:
        super().__init__(info, idempotency_key, answered)
        self._send_call = send

    def refresh(self) -> OperationInfo | None:
        """Reads the operation again."""
        self._poll()
        return self.info

    def _poll(self) -> str | None:
        if self.id is None:
            return None
        resp = self._send_call(get_call(self.id))
        self.info = cast(OperationInfo, resp.json())
        value: str | None = resp.headers.get("retry-after")
        return value

    def result(self) -> Response:
        """The kept answer of a done operation; :class:`OperationFailed` for a failed
        one, :class:`postguard.ApiError` ``OPERATION_NOT_DONE`` before."""
        if self._answered is not None or self.id is None or self.info is None:
            if self._answered is None:
                raise errors.PostguardError("an operation handle without an operation")
            return self._answered
        failed = self.state == "failed"
        try:
            return self._send_call(result_call(self.id, failed=failed))
        except errors.ApiError as err:
            if failed:
                raise failed_error(self.id, self.info, err) from err
            raise

    def wait(
        self, timeout: float | None = None, *, min_interval: float = 1.0, max_interval: float = 30.0
    ) -> Response:
        """Polls until the operation is done, each poll after its ``Retry-After``, then
        returns :meth:`result`. ``timeout`` (seconds) raises :class:`OperationWaitTimeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.done:
            retry_after = self._poll()
            if self.done:
                break
            left = float("inf") if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise OperationWaitTimeout(f"operation {self.id} is still {self.state}")
            time.sleep(pause_s(retry_after, min_interval, max(min_interval, max_interval), left))
        return self.result()


class AsyncOperation(_Handle):
    """An operation of :class:`postguard.AsyncClient`: the same, awaited."""

    def __init__(
        self,
        send: Callable[[Call], Awaitable[Response]],
        info: OperationInfo | None,
        idempotency_key: str | None,
        answered: Response | None = None,
        sleep: Callable[[float], Awaitable[Any]] | None = None,
    ) -> None:
        super().__init__(info, idempotency_key, answered)
        self._send_call = send
        self._sleep = sleep

    async def refresh(self) -> OperationInfo | None:
        await self._poll()
        return self.info

    async def _poll(self) -> str | None:
        if self.id is None:
            return None
        resp = await self._send_call(get_call(self.id))
        self.info = cast(OperationInfo, resp.json())
        value: str | None = resp.headers.get("retry-after")
        return value

    async def result(self) -> Response:
        if self._answered is not None or self.id is None or self.info is None:
            if self._answered is None:
                raise errors.PostguardError("an operation handle without an operation")
            return self._answered
        failed = self.state == "failed"
        try:
            return await self._send_call(result_call(self.id, failed=failed))
        except errors.ApiError as err:
            if failed:
                raise failed_error(self.id, self.info, err) from err
            raise

    async def wait(
        self, timeout: float | None = None, *, min_interval: float = 1.0, max_interval: float = 30.0
    ) -> Response:
        import asyncio

        sleep = self._sleep or asyncio.sleep
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.done:
            retry_after = await self._poll()
            if self.done:
                break
            left = float("inf") if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise OperationWaitTimeout(f"operation {self.id} is still {self.state}")
            await sleep(pause_s(retry_after, min_interval, max(min_interval, max_interval), left))
        return await self.result()
