"""Settings and per-attempt bookkeeping common to :class:`Client` and
:class:`AsyncClient`; the two differ only in how they send and wait."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping

import httpx

from . import errors
from ._core import Decision, RateLimitInfo, RetryPolicy, Throttle, decide, parse_rate_limit
from ._http import (
    USER_AGENT,
    AttemptHook,
    AttemptInfo,
    Call,
    Response,
    error_from,
    network_error,
    outcome_of,
)

DEFAULT_TIMEOUT_S = 60.0


def is_gateway_path(path: str) -> bool:
    """A gateway endpoint (``/_postguard/…``), not a call through the API."""
    return path == "/_postguard" or path.startswith("/_postguard/")


class _Secret:
    """A credential that never prints: its ``repr``/``str`` are a placeholder, so
    ``vars(client)``, debuggers and logging of client internals show no token."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "<redacted>"

    __str__ = __repr__


def _secret(value: str | None) -> _Secret | None:
    return None if value is None else _Secret(value)


class BaseClient:
    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        admin_token: str | None = None,
        origin_token: str | None = None,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT_S,
        retry: RetryPolicy | None = None,
        proactive: bool = True,
        threshold: int | None = None,
        pacing: bool = False,
        user_agent: str | None = None,
        headers: Mapping[str, str] | None = None,
        on_attempt: AttemptHook | None = None,
        _random: Callable[[], float] | None = None,
        _monotonic: Callable[[], float] | None = None,
        _epoch: Callable[[], float] | None = None,
    ) -> None:
        """
        :param base_url: the gateway, e.g. ``https://api.example.com``.
        :param api_key: ``Authorization`` for proxied calls and the key's own endpoints.
        :param admin_token: for the operator endpoints (keys, portal links).
        :param origin_token: for publishing events (the origin's credential).
        :param timeout: seconds (or an ``httpx.Timeout``) per attempt; default 60 s,
            above the gateway's 30 s origin timeout.
        :param retry: attempts and backoff (default 5 attempts, 0.5 s base, 60 s cap).
        :param proactive: wait for the window's reset when the budget runs low
            (``threshold``) instead of running into 429s.
        :param threshold: the budget kept in reserve; 0 uses all of it. Default: a
            tenth of the limit the gateway advertises, at least 1, at most limit − 1.
        :param pacing: also spread requests evenly over the window.
        :param on_attempt: called after every attempt with an :class:`AttemptInfo`
            (its ``retry_in_s`` is the wait planned before the next attempt).
        """
        self.base_url = base_url.rstrip("/")
        self._tokens = {
            "api_key": _secret(api_key),
            "admin": _secret(admin_token),
            "origin": _secret(origin_token),
        }
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self.proactive = proactive
        self.throttle = Throttle(threshold, pacing=pacing)
        self.user_agent = user_agent or USER_AGENT
        self._extra_headers = {k.lower(): v for k, v in (headers or {}).items()}
        self.on_attempt = on_attempt
        self._random = _random or random.Random().random
        self._monotonic = _monotonic or time.monotonic
        self._epoch = _epoch or time.time

    def __repr__(self) -> str:
        # Which credentials are set, never their values.
        held = [name for name, token in self._tokens.items() if token is not None]
        return f"<postguard.{type(self).__name__} {self.base_url} credentials={held}>"

    __str__ = __repr__

    # -- building an attempt --------------------------------------------------------

    def _headers(self, call: Call) -> dict[str, str]:
        h = {"user-agent": self.user_agent, "accept": "application/json", **self._extra_headers}
        h.update(call.headers)
        if call.auth != "none":
            token = self._tokens[call.auth]
            if token is None or not token.reveal():
                raise errors.ConfigurationError(
                    f"{call.method} {call.path} needs the client's {call.auth.replace('_', ' ')}"
                    f"{'' if call.auth == 'api_key' else ' token'}"
                )
            h["authorization"] = f"Bearer {token.reveal()}"
        if call.idempotency_key is not None:
            h["idempotency-key"] = call.idempotency_key
        return h

    def _request(self, http: httpx.Client | httpx.AsyncClient, call: Call) -> httpx.Request:
        return http.build_request(
            call.method,
            self.base_url + call.path,
            params=call.params or None,
            content=call.content,
            headers=self._headers(call),
            timeout=call.timeout if call.timeout is not None else self.timeout,
        )

    def _throttled(self, call: Call) -> bool:
        # The budget belongs to the API key: operator and origin calls do not count, nor
        # do the gateway's own endpoints — charged to the key's gateway policy, or free
        # (`/me`, the idempotency lookup, which must not wait for the API's window).
        return self.proactive and call.auth == "api_key" and not is_gateway_path(call.path)

    def _rate_info(self, raw: httpx.Response | None) -> RateLimitInfo | None:
        return None if raw is None else parse_rate_limit(raw.headers, self._epoch())

    # -- after an attempt -------------------------------------------------------------

    def _decide(
        self, call: Call, attempt: int, raw: httpx.Response | None, err: Exception | None
    ) -> Decision:
        outcome = outcome_of(raw, self._epoch())
        decision = decide(attempt, outcome, self.retry, self._random(), replay_safe=call.replay_safe)
        if call.max_attempts is not None and attempt >= call.max_attempts:
            decision = Decision(retry=False)
        if self.on_attempt is not None:
            self.on_attempt(
                AttemptInfo(
                    call.method,
                    call.path,
                    attempt,
                    call.idempotency_key,
                    raw.status_code if raw is not None else None,
                    raw.headers if raw is not None else None,
                    err,
                    decision.delay_s if decision.retry else None,
                )
            )
        return decision

    def _result(
        self, call: Call, raw: httpx.Response | None, err: Exception | None, attempts: int
    ) -> Response:
        if raw is None:
            raise network_error(err or RuntimeError("no answer"), call, attempts) from err
        if raw.status_code >= 400:
            raise error_from(raw, call, attempts)
        return Response(raw, attempts=attempts, idempotency_key=call.idempotency_key)
