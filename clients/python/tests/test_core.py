"""Unit tests of the pure core: backoff (fake random), classification, header parsing,
and the throttle driven by a fake clock."""

from __future__ import annotations

import pytest

from postguard import (
    RateLimitInfo,
    RetryPolicy,
    Throttle,
    backoff_delay,
    decide,
    is_retryable,
    parse_rate_limit,
    replay_safe,
    reserve_for,
)
from postguard._core import Outcome, parse_retry_after

POLICY = RetryPolicy(max_attempts=5, base_delay_s=0.5, max_delay_s=60.0, jitter=0.3)


class TestBackoff:
    def test_exponential_without_jitter(self) -> None:
        assert [backoff_delay(n, None, POLICY, 0.0) for n in range(5)] == [0.5, 1.0, 2.0, 4.0, 8.0]

    @pytest.mark.parametrize("n", range(6))
    def test_jitter_stays_within_0_to_30_percent(self, n: int) -> None:
        base = 0.5 * 2**n
        lo = backoff_delay(n, None, POLICY, 0.0)
        hi = backoff_delay(n, None, POLICY, 0.999999)
        assert lo == pytest.approx(base)
        assert hi == pytest.approx(base * 1.3, rel=1e-5)
        for i in range(100):
            d = backoff_delay(n, None, POLICY, i / 100)
            assert base <= d < base * 1.3 + 1e-9

    def test_capped_at_60_s(self) -> None:
        assert backoff_delay(10, None, POLICY, 0.0) == 60.0
        assert backoff_delay(7, None, POLICY, 0.99) == 60.0  # 64 s * 1.3 → 60
        assert backoff_delay(10_000, None, POLICY, 0.5) == 60.0  # no overflow

    def test_retry_after_is_the_base_of_the_exponent(self) -> None:
        assert backoff_delay(0, 3.0, POLICY, 0.0) == 3.0
        assert backoff_delay(1, 3.0, POLICY, 0.0) == 6.0
        assert backoff_delay(2, 3.0, POLICY, 0.5) == pytest.approx(12.0 * 1.15)

    def test_retry_after_is_a_floor_even_above_the_cap(self) -> None:
        # A server asking for 120 s is obeyed: the cap never undercuts Retry-After.
        assert backoff_delay(0, 120.0, POLICY, 0.0) == 120.0
        assert backoff_delay(3, 120.0, POLICY, 0.9) == 120.0

    def test_small_retry_after_never_goes_below_base(self) -> None:
        assert backoff_delay(0, 0.0, POLICY, 0.0) == 0.5
        assert backoff_delay(0, 0.1, POLICY, 0.0) == 0.5

    def test_policy_validation(self) -> None:
        with pytest.raises(ValueError):
            RetryPolicy(max_attempts=0)
        with pytest.raises(ValueError):
            RetryPolicy(jitter=1.5)


class TestDecide:
    @pytest.mark.parametrize(
        "outcome",
        [
            Outcome(None),
            Outcome(502),
            Outcome(503),
            Outcome(504, "ORIGIN_TIMEOUT"),
            Outcome(429, "RATE_LIMIT_EXCEEDED", 2.0),
            Outcome(409, "IDEMPOTENCY_KEY_IN_PROGRESS", 1.0),
        ],
    )
    def test_retried(self, outcome: Outcome) -> None:
        d = decide(1, outcome, POLICY, 0.0)
        assert d.retry
        assert d.delay_s == max(outcome.retry_after_s or 0.0, 0.5)

    @pytest.mark.parametrize(
        "outcome",
        [
            Outcome(200),
            Outcome(201),
            Outcome(204),
            Outcome(400, "IDEMPOTENCY_KEY_REQUIRED"),
            Outcome(401, "INVALID_API_KEY"),
            Outcome(403, "FORBIDDEN"),
            Outcome(404, "NOT_FOUND"),
            Outcome(409),  # an origin's own 409 is an answer, not "in progress"
            Outcome(408),
            Outcome(422, "IDEMPOTENCY_KEY_REUSE_CONFLICT"),
            Outcome(500),
        ],
    )
    def test_final(self, outcome: Outcome) -> None:
        assert not decide(1, outcome, POLICY, 0.0).retry

    @pytest.mark.parametrize("outcome", [Outcome(None), Outcome(502), Outcome(503), Outcome(504)])
    def test_maybe_executed_is_retried_only_when_replay_safe(self, outcome: Outcome) -> None:
        # A lost answer or a 502/503/504 may have run: a mutating call without a key is
        # not sent again (issue 23 item 1); with a key the gateway replays the first answer.
        assert not decide(1, outcome, POLICY, 0.0, replay_safe=False).retry
        assert decide(1, outcome, POLICY, 0.0, replay_safe=True).retry
        assert not is_retryable(outcome, replay_safe=False)

    @pytest.mark.parametrize(
        "outcome",
        [Outcome(429, "RATE_LIMIT_EXCEEDED", 2.0), Outcome(409, "IDEMPOTENCY_KEY_IN_PROGRESS", 1.0)],
    )
    def test_not_executed_is_retried_without_a_key_too(self, outcome: Outcome) -> None:
        assert decide(1, outcome, POLICY, 0.0, replay_safe=False).retry

    def test_replay_safe(self) -> None:
        assert replay_safe("POST", "k") and replay_safe("DELETE", "k")
        assert not replay_safe("POST", None) and not replay_safe("patch", None)
        assert replay_safe("GET", None) and replay_safe("HEAD", None)

    def test_bounded_attempts(self) -> None:
        delays = []
        attempts = 1
        while (d := decide(attempts, Outcome(503), POLICY, 0.0)).retry:
            delays.append(d.delay_s)
            attempts += 1
        assert attempts == 5
        assert delays == [0.5, 1.0, 2.0, 4.0]


class TestHeaders:
    def test_retry_after_forms(self) -> None:
        assert parse_retry_after("7", 0) == 7.0
        assert parse_retry_after(None, 0) is None
        assert parse_retry_after("soon", 0) is None
        assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", 1445412470.0) == pytest.approx(10.0)

    def test_ietf_fields_win_and_carry_the_policy(self) -> None:
        h = {
            "ratelimit": '"default";r=47;t=13',
            "ratelimit-policy": '"default";q=60;w=60',
            "x-ratelimit-remaining": "99",
            "x-ratelimit-reset": "1716392460",
        }
        assert parse_rate_limit(h, 0) == RateLimitInfo(remaining=47, reset_in_s=13.0, limit=60, window_s=60.0)

    def test_most_restrictive_policy(self) -> None:
        h = {
            "ratelimit": '"minute";r=40;t=50, "second";r=2;t=1',
            "ratelimit-policy": '"minute";q=60;w=60, "second";q=5;w=1',
        }
        assert parse_rate_limit(h, 0) == RateLimitInfo(2, 1.0, 5, 1.0)

    def test_x_headers_alone(self) -> None:
        h = {"x-ratelimit-limit": "10", "x-ratelimit-remaining": "3", "x-ratelimit-reset": "1700000005"}
        assert parse_rate_limit(h, 1700000000.4) == RateLimitInfo(3, 5.0, 10, None)

    def test_absent_or_garbled(self) -> None:
        assert parse_rate_limit({}, 0) is None
        assert parse_rate_limit({"x-ratelimit-remaining": "x", "x-ratelimit-reset": "1"}, 0) is None
        assert parse_rate_limit({"ratelimit": "garbage"}, 0) is None


def info(remaining: int, t: float, limit: int = 10, window: float = 5.0) -> RateLimitInfo:
    return RateLimitInfo(remaining, t, limit, window)


class TestThrottle:
    def test_first_request_probes_alone(self) -> None:
        th = Throttle(threshold=0)
        assert th.next_wait(0.0) == 0.0
        th.on_send(0.0)
        assert th.next_wait(0.0) is None  # wait for the probe's answer
        th.on_response(0.1, info(9, 5))
        assert th.next_wait(0.1) == 0.0

    def test_threshold_zero_uses_the_whole_budget_counting_in_flight(self) -> None:
        th = Throttle(threshold=0)
        th.on_send(0.0)
        th.on_response(0.1, info(9, 5))  # reset at 5.1
        sent = 0
        while th.next_wait(0.1) == 0.0:
            th.on_send(0.1)
            sent += 1
        assert sent == 9  # 9 left, all of them in flight now
        assert th.next_wait(0.1) == pytest.approx(5.0)

    def test_reserve_is_a_tenth_of_the_limit_at_least_one_never_all(self) -> None:
        assert [reserve_for(n) for n in (1, 2, 5, 10, 19, 20, 60, 2000)] == [0, 1, 1, 1, 1, 2, 6, 200]
        assert [reserve_for(10, t) for t in (0, 5, 50)] == [0, 5, 9]  # explicit: absolute, ≤ limit − 1
        assert reserve_for(0) == 0

    def test_default_reserve_on_a_ten_per_window_plan_keeps_one(self) -> None:
        th = Throttle()
        th.on_send(0.0)
        th.on_response(0.1, info(9, 5))
        sent = 0
        while th.next_wait(0.1) == 0.0:
            th.on_send(0.1)
            sent += 1
        assert sent == 8  # 9 - 8 in flight = 1 = a tenth of 10

    def test_default_reserve_on_a_five_per_window_plan_sends_four(self) -> None:
        # Issue 25 item 7: the old fixed reserve of 5 (capped at limit − 1) let one call
        # through per window on this plan; a tenth (at least 1) lets four.
        for threshold, expected in ((None, 4), (5, 1)):
            th = Throttle(threshold)
            th.on_send(0.0)
            th.on_response(0.1, RateLimitInfo(4, 5.0, 5, 5.0))
            sent = 1
            while th.next_wait(0.1) == 0.0:
                th.on_send(0.1)
                sent += 1
            assert sent == expected, threshold

    def test_out_of_order_answers_keep_the_lowest_remaining(self) -> None:
        th = Throttle(threshold=0)
        th.on_send(0.0)
        th.on_response(0.1, info(9, 5))
        for _ in range(3):
            th.on_send(0.1)
        th.on_response(0.2, info(6, 5))
        th.on_response(0.2, info(8, 5))  # an earlier admission answering late
        assert th.remaining == 6
        assert th.in_flight == 1

    def test_after_the_reset_the_full_limit_is_assumed(self) -> None:
        th = Throttle(threshold=0)
        th.on_send(0.0)
        th.on_response(0.1, info(0, 5))
        assert th.next_wait(1.0) == pytest.approx(4.1)
        assert th.next_wait(5.1) == 0.0
        assert th.remaining == 10

    def test_the_earliest_reset_estimate_wins(self) -> None:
        # `t` is rounded up: the answer that arrives nearest a whole second is the most precise.
        th = Throttle(threshold=0)
        th.on_send(0.0)
        th.on_response(0.05, info(9, 5))  # window opened at ~0.0: reset ≤ 5.05
        th.on_send(0.9)
        th.on_response(0.95, info(8, 5))  # ceil(4.1) = 5: reset ≤ 5.95 (looser)
        assert th.reset_at == pytest.approx(5.05)

    def test_late_answer_from_an_ended_window_is_ignored(self) -> None:
        th = Throttle(threshold=0)
        th.on_send(0.0)
        th.on_response(0.1, info(5, 5))
        th.on_send(5.0)
        assert th.next_wait(5.2) == 0.0  # window rolled: 10 assumed
        th.on_response(5.2, info(0, 1))  # sent before the reset, admitted in the old window
        assert th.remaining == 10

    def test_a_newer_window_replaces_the_state(self) -> None:
        th = Throttle(threshold=0)
        th.on_send(0.0)
        th.on_response(0.1, info(2, 1))
        th.on_send(0.2)
        th.on_response(1.5, info(9, 5))  # reset estimate 6.5, far after 1.1
        assert th.remaining == 9
        assert th.reset_at == pytest.approx(6.5)

    def test_429_answers_close_the_budget_until_reset(self) -> None:
        th = Throttle(threshold=0)
        th.on_send(0.0)
        th.on_response(0.1, info(0, 3))
        assert th.next_wait(0.2) == pytest.approx(2.9)

    def test_threshold_above_the_limit_still_admits_one_per_window(self) -> None:
        th = Throttle(threshold=5)
        th.on_send(0.0)
        th.on_response(0.1, RateLimitInfo(2, 5, 3, 5))  # limit 3: the reserve shrinks to 2
        assert th.next_wait(0.1) == pytest.approx(5.0)
        assert th.next_wait(5.1) == 0.0  # a fresh window: 3 > 2
        th.on_send(5.1)
        assert th.next_wait(5.1) is None  # the answer tells the new window's end

    def test_no_headers_means_no_waiting(self) -> None:
        th = Throttle()
        th.on_send(0.0)
        th.on_response(0.1, None)
        th.on_send(0.1)
        assert th.next_wait(0.1) == 0.0

    def test_pacing_spreads_sends_over_the_window(self) -> None:
        th = Throttle(threshold=0, pacing=True)
        th.on_send(0.0)
        th.on_response(0.1, info(9, 5))
        assert th.next_wait(0.1) == pytest.approx(0.4)  # 5 s / 10 = 0.5 s apart
        assert th.next_wait(0.5) == 0.0
        th.on_send(0.5)
        assert th.next_wait(0.6) == pytest.approx(0.4)
