"""The shared limiter of one client instance: the pure :class:`Throttle` behind a
lock. Every concurrent call of the client waits here before each attempt, and every
ended attempt wakes the waiters (its headers may have opened the budget)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable

from ._core import RateLimitInfo, Throttle

# A waiter with nothing to wait for but an answer re-checks this often anyway, so that
# even an attempt that never reports back cannot park the others for good.
_MAX_PARK_S = 5.0


class SyncLimiter:
    """Thread-safe: for :class:`postguard.Client` used from many threads."""

    def __init__(self, throttle: Throttle, monotonic: Callable[[], float]) -> None:
        self._throttle = throttle
        self._now = monotonic
        self._cond = threading.Condition()

    def acquire(self) -> None:
        with self._cond:
            while True:
                wait = self._throttle.next_wait(self._now())
                if wait == 0.0:
                    self._throttle.on_send(self._now())
                    return
                self._cond.wait(timeout=min(wait if wait is not None else _MAX_PARK_S, _MAX_PARK_S))

    def release(self, info: RateLimitInfo | None) -> None:
        with self._cond:
            self._throttle.on_response(self._now(), info)
            self._cond.notify_all()


class AsyncLimiter:
    """asyncio-safe: for :class:`postguard.AsyncClient` (one event loop). No lock is
    needed, since nothing runs between a check and the await that follows it; an
    answer wakes the waiters by setting the current event and starting a new one.
    ``release`` is synchronous so that it also runs when the call is cancelled."""

    def __init__(self, throttle: Throttle, monotonic: Callable[[], float]) -> None:
        self._throttle = throttle
        self._now = monotonic
        self._changed: asyncio.Event | None = None

    async def acquire(self) -> None:
        while True:
            wait = self._throttle.next_wait(self._now())
            if wait == 0.0:
                self._throttle.on_send(self._now())
                return
            if self._changed is None:
                self._changed = asyncio.Event()
            timeout = min(wait if wait is not None else _MAX_PARK_S, _MAX_PARK_S)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout)

    def release(self, info: RateLimitInfo | None) -> None:
        self._throttle.on_response(self._now(), info)
        if self._changed is not None:
            self._changed.set()
            self._changed = None
