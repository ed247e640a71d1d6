"""The SDK's decisions, without I/O.

Both clients (sync and async) ask this module what to do — whether an answer is
retried and after how long, what the rate-limit headers say, whether a request may
be sent now — and do only the sending and the waiting themselves. Every function
takes the time and the random draw as arguments, so the tests drive it with a fake
clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

#: Methods that change state: each call gets one Idempotency-Key for all its attempts.
MUTATING_METHODS = frozenset({"POST", "PATCH", "PUT", "DELETE"})
#: Methods a second attempt cannot harm.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: Gateway/origin statuses worth another attempt (the request was not stored).
RETRYABLE_STATUSES = frozenset({502, 503, 504})
IN_PROGRESS = "IDEMPOTENCY_KEY_IN_PROGRESS"


@dataclass(frozen=True)
class RetryPolicy:
    """How persistent a client is.

    ``max_attempts`` counts the first attempt: 5 means one call and up to 4 retries.
    The delay before retry ``n`` (0-based) is
    ``min(max_delay_s, max(Retry-After, base_delay_s) * 2**n * (1 + jitter * U[0,1)))``,
    and never less than ``Retry-After``: the server's floor wins over the cap.
    """

    max_attempts: int = 5
    base_delay_s: float = 0.5
    max_delay_s: float = 60.0
    jitter: float = 0.3

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.base_delay_s < 0 or self.max_delay_s < 0:
            raise ValueError("delays must not be negative")
        if not 0 <= self.jitter <= 1:
            raise ValueError("jitter must be within 0..1")


def backoff_delay(retry_index: int, retry_after_s: float | None, policy: RetryPolicy, rand: float) -> float:
    """Seconds to wait before retry number ``retry_index`` (0 = the first retry).

    ``rand`` is a draw from [0, 1): the jitter is ``jitter * rand`` of the delay, so
    that many clients failing together do not come back together.
    """
    floor = max(retry_after_s or 0.0, policy.base_delay_s)
    # The exponent is bounded so that absurd attempt counts cannot overflow a float.
    raw = floor * 2.0 ** min(retry_index, 30) * (1.0 + policy.jitter * rand)
    return max(min(raw, policy.max_delay_s), retry_after_s or 0.0)


@dataclass(frozen=True)
class Outcome:
    """What one attempt produced: a status (``None`` for a network error or timeout),
    the problem's ``code`` when the answer was problem+json, and ``Retry-After``."""

    status: int | None
    code: str | None = None
    retry_after_s: float | None = None


def replay_safe(method: str, idempotency_key: str | None) -> bool:
    """Whether a second attempt is harmless when the first may have run: a safe method,
    or a call carrying an Idempotency-Key (the gateway answers a repeated key with the
    stored result)."""
    return idempotency_key is not None or method.upper() in SAFE_METHODS


def is_retryable(outcome: Outcome, replay_safe: bool = True) -> bool:
    """429 and 409 in-progress were not executed: always worth retrying. A network
    error or 502/503/504 may have been executed: retried only when ``replay_safe`` (a
    mutating call without an Idempotency-Key is not). Every other answer (2xx, 3xx,
    400, 401, 403, 404, 422, other 4xx, 500) is final."""
    status = outcome.status
    if status == 429:
        return True
    if status == 409:
        return outcome.code == IN_PROGRESS
    return replay_safe and (status is None or status in RETRYABLE_STATUSES)


@dataclass(frozen=True)
class Decision:
    retry: bool
    delay_s: float = 0.0


def decide(
    attempts_made: int, outcome: Outcome, policy: RetryPolicy, rand: float, *, replay_safe: bool = True
) -> Decision:
    """After ``attempts_made`` attempts (≥ 1) ended with ``outcome``: retry, and when?
    ``replay_safe`` says whether the call may run twice harmlessly (see
    :func:`replay_safe`); the clients pass it for every call."""
    if not is_retryable(outcome, replay_safe) or attempts_made >= policy.max_attempts:
        return Decision(retry=False)
    return Decision(True, backoff_delay(attempts_made - 1, outcome.retry_after_s, policy, rand))


def parse_retry_after(value: str | None, now_epoch_s: float) -> float | None:
    """``Retry-After`` as seconds from now: delta-seconds or an HTTP-date; ``None``
    when absent or unreadable (a garbled header must not turn into "retry at once")."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - now_epoch_s)


@dataclass(frozen=True)
class RateLimitInfo:
    """The rate-limit state one response reported.

    ``reset_in_s`` is the time from the response's arrival until the window ends
    (the server rounds it up, so waiting that long is always enough).
    """

    remaining: int
    reset_in_s: float
    limit: int | None = None
    window_s: float | None = None


def _sf_items(value: str) -> list[tuple[str, dict[str, str]]]:
    """The members of an RFC 8941 list like ``"default";r=47;t=13, "burst";r=2;t=1``
    (enough of the grammar for the RateLimit fields: names and integer parameters)."""
    items = []
    for member in value.split(","):
        parts = [p.strip() for p in member.split(";")]
        if not parts[0]:
            continue
        params = {}
        for p in parts[1:]:
            k, _, v = p.partition("=")
            params[k.strip().lower()] = v.strip()
        items.append((parts[0].strip('"'), params))
    return items


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    value = value.strip()
    return int(value) if value.isdigit() else None


def _from_ietf(headers: Mapping[str, str]) -> RateLimitInfo | None:
    raw = headers.get("ratelimit")
    if raw is None:
        return None
    best: tuple[str, int, int] | None = None
    for name, params in _sf_items(raw):
        r, t = _int(params.get("r")), _int(params.get("t"))
        if r is not None and t is not None and (best is None or r < best[1]):
            best = (name, r, t)  # several policies: the most restrictive one governs
    if best is None:
        return None
    name, remaining, reset_in = best
    limit = window = None
    for pname, params in _sf_items(headers.get("ratelimit-policy", "")):
        if pname == name:
            limit = _int(params.get("q"))
            w = _int(params.get("w"))
            window = float(w) if w is not None else None
    return RateLimitInfo(remaining, float(reset_in), limit, window)


def _from_x_headers(headers: Mapping[str, str], now_epoch_s: float) -> RateLimitInfo | None:
    remaining = _int(headers.get("x-ratelimit-remaining"))
    reset = _int(headers.get("x-ratelimit-reset"))
    if remaining is None or reset is None:
        return None
    # Unix seconds (postguard, GitHub) or, from some other APIs, seconds from now.
    reset_in = reset - now_epoch_s if reset > 1_000_000_000 else float(reset)
    limit = _int(headers.get("x-ratelimit-limit"))
    return RateLimitInfo(remaining, max(0.0, math.ceil(reset_in)), limit, None)


def parse_rate_limit(headers: Mapping[str, str], now_epoch_s: float) -> RateLimitInfo | None:
    """The IETF ``RateLimit``/``RateLimit-Policy`` fields when present (relative
    times, immune to clock skew), else ``X-RateLimit-*``. Header names are expected
    in lower case (httpx's ``Headers`` matches case-insensitively anyway)."""
    info = _from_ietf(headers)
    if info is not None and info.limit is None:
        info = RateLimitInfo(info.remaining, info.reset_in_s, _int(headers.get("x-ratelimit-limit")), None)
    return info or _from_x_headers(headers, now_epoch_s)


#: The default reserve's share of the plan's limit.
RESERVE_SHARE = 0.1


def reserve_for(limit: int, threshold: int | None = None) -> int:
    """The budget kept in reserve on a plan of ``limit`` per window: ``threshold`` when
    given, else a tenth of the limit rounded down and at least 1 (for other processes
    sharing the key) — and never the whole budget: at most ``limit - 1``, so every
    window admits at least one call."""
    wanted = max(1, math.floor(limit * RESERVE_SHARE)) if threshold is None else max(0, threshold)
    return min(wanted, max(limit - 1, 0))


class Throttle:
    """One client's shared view of its API key's budget (the "central counter").

    Pure state: every method takes ``now`` (monotonic seconds). The clients wrap it in
    a condition (sync, threads) or an event (async, one loop) and wake the waiters on
    every ended attempt.

    * ``remaining`` is the lowest budget any response of the current window reported;
      ``in_flight`` counts requests sent and not yet answered, which the server may
      already have counted. A request is admitted while ``remaining - in_flight`` is
      above the reserve, i.e. after it the budget would still be at least the reserve:
      ``threshold=0`` uses the whole budget; the default (``None``) keeps a tenth of the
      advertised limit, at least 1 (see :func:`reserve_for`).
    * ``reset_at`` is the earliest upper bound of the window's end any response gave
      (arrival + ``t``). Once it has passed the window is assumed fresh: ``remaining``
      is the full limit again until responses say otherwise.
    * Before the first response nothing is known: one request goes alone (a probe).
    * Pacing spreads admissions ``window / limit`` apart.
    """

    def __init__(self, threshold: int | None = None, *, pacing: bool = False) -> None:
        if threshold is not None and threshold < 0:
            raise ValueError("threshold must not be negative")
        self.threshold = threshold
        self.pacing = pacing
        self.limit: int | None = None
        self.window_s: float | None = None
        self.remaining: int | None = None
        self.reset_at: float | None = None
        self.in_flight = 0
        self.last_send: float | None = None
        # A response came without rate-limit fields: nothing to wait for.
        self.blind = False
        # The end of the last window that has passed: stale answers from it are ignored.
        self._ended_at: float | None = None

    def _roll(self, now: float) -> None:
        if self.reset_at is not None and now >= self.reset_at:
            self._ended_at = self.reset_at
            self.reset_at = None
            self.remaining = self.limit  # None when the limit was never told

    def _effective_threshold(self) -> int:
        if self.limit is None:
            # The limit was never told (no q, no X-RateLimit-Limit): keep one back by default.
            return 1 if self.threshold is None else self.threshold
        return reserve_for(self.limit, self.threshold)

    def next_wait(self, now: float) -> float | None:
        """0.0: send now (then call :meth:`on_send`). A positive number: wait at most
        that long, then ask again (a response may wake the waiter earlier). ``None``:
        wait for a response."""
        self._roll(now)
        if self.remaining is None:
            if self.blind or self.in_flight == 0:
                return 0.0
            return None  # the probe is out: its answer tells the budget
        if self.remaining - self.in_flight <= self._effective_threshold():
            if self.reset_at is None:
                return None  # the in-flight answers will tell
            return max(self.reset_at - now, 0.001)
        if self.pacing and self.limit and self.window_s and self.last_send is not None:
            due = self.last_send + self.window_s / self.limit
            if now < due:
                return due - now
        return 0.0

    def on_send(self, now: float) -> None:
        self.in_flight += 1
        self.last_send = now

    def on_response(self, now: float, info: RateLimitInfo | None) -> None:
        """An attempt ended (answered or failed): ``info`` is what its headers said."""
        self.in_flight = max(0, self.in_flight - 1)
        if info is None:
            if self.remaining is None:
                self.blind = True
            return
        self.blind = False
        self._roll(now)
        if info.limit is not None:
            self.limit = info.limit
        if info.window_s is not None:
            self.window_s = info.window_s
        candidate = now + info.reset_in_s
        # Windows are at least `window` apart; answers whose estimated ends differ by
        # less than half a window (at least the 1 s rounding) describe the same window.
        same = max(1.0, (self.window_s or 2.0) / 2)
        if self.reset_at is None:
            if self._ended_at is not None and candidate < self._ended_at + same:
                return  # a late answer from the window that has already ended
            self.reset_at, self.remaining = candidate, info.remaining
        elif candidate > self.reset_at + same:
            self.reset_at, self.remaining = candidate, info.remaining  # a newer window
        elif candidate >= self.reset_at - same:
            self.reset_at = min(self.reset_at, candidate)
            self.remaining = min(
                self.remaining if self.remaining is not None else info.remaining, info.remaining
            )
