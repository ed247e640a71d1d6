//! What happens after a delivery attempt, and when the next one is due
//! (docs/webhooks.md "Outcome of an attempt" and "Schedule").
//!
//! `schedule` lists the delays *between* attempts, so a schedule of `n`
//! delays allows `n + 1` attempts (default `[60, 900, 3600, 86400]`: five
//! attempts over about 25 h). After the last one the delivery is
//! dead-lettered: nothing is retried forever, nothing is dropped silently.
//!
//! | attempt result                      | outcome                                   |
//! |-------------------------------------|-------------------------------------------|
//! | 2xx                                 | `Delivered`                               |
//! | 429                                 | retry after `Retry-After`, bounded to `[1, max(schedule)]` |
//! | other 4xx (410 included)            | `DeadLetter` at once: the receiver refused |
//! | 1xx, 3xx, 5xx, timeout, network error | retry on the schedule                   |
//!
//! Redirects are not followed (a 3xx would let the receiver point the gateway
//! anywhere, around the URL rules), so a 3xx is treated as a failed attempt.
//!
//! Cloudflare Queues delay a message by at most 12 h, while the default
//! schedule has a 24 h step: the consumer stores `not_before` and re-enqueues
//! with [`next_hop`] until it is reached.

use serde::{Deserialize, Serialize};

/// Cloudflare Queues' maximum delay (12 h).
pub const MAX_QUEUE_DELAY_S: u64 = 43_200;

/// What one attempt observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptResult {
    /// The receiver answered; `retry_after` is its `Retry-After` header, if any.
    Status {
        code: u16,
        retry_after: Option<String>,
    },
    /// No answer within the configured timeout.
    Timeout,
    /// DNS, TLS, connection refused or reset, …
    NetworkError,
}

/// What to do with the delivery after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    Delivered,
    Retry { delay_s: u64 },
    DeadLetter,
}

/// How many attempts a schedule allows: one more than its delays.
pub fn max_attempts(schedule: &[u32]) -> u32 {
    u32::try_from(schedule.len())
        .unwrap_or(u32::MAX)
        .saturating_add(1)
}

/// The schedule's delay after attempt `attempt` (1-based); a 0 in the
/// schedule counts as 1 s (configuration refuses 0 anyway).
fn scheduled_delay(schedule: &[u32], attempt: u32) -> u64 {
    let i = usize::try_from(attempt.saturating_sub(1)).unwrap_or(usize::MAX);
    let d = schedule
        .get(i)
        .or_else(|| schedule.last())
        .copied()
        .unwrap_or(1);
    u64::from(d).max(1)
}

/// `attempt` = 1-based number of the attempt just made; `schedule` = delays
/// between attempts (default `[60, 900, 3600, 86400]` → 5 attempts). 2xx →
/// `Delivered`. 429 → `Retry` after its `Retry-After` (delta-seconds or an
/// HTTP-date relative to `now_ms`), bounded to `[1, max(schedule)]`
/// (missing/invalid → the schedule's delay for this attempt). Other 4xx
/// (incl. 410) → `DeadLetter` at once. 1xx/3xx/5xx/`Timeout`/`NetworkError`
/// → `Retry { delay_s: schedule[attempt-1] }`. Whenever a retry would be
/// attempt number > `schedule.len() + 1` (i.e. attempt ≥ `schedule.len() + 1`
/// already made), → `DeadLetter` instead.
pub fn classify(result: &AttemptResult, attempt: u32, schedule: &[u32], now_ms: u64) -> Outcome {
    let retry = |delay_s: u64| {
        if attempt >= max_attempts(schedule) {
            Outcome::DeadLetter
        } else {
            Outcome::Retry { delay_s }
        }
    };
    match result {
        AttemptResult::Status {
            code: 200..=299, ..
        } => Outcome::Delivered,
        AttemptResult::Status {
            code: 429,
            retry_after,
        } => {
            let cap = schedule.iter().copied().max().map_or(1, u64::from).max(1);
            let delay = retry_after
                .as_deref()
                .and_then(|v| parse_retry_after(v, now_ms))
                .map_or_else(|| scheduled_delay(schedule, attempt), |s| s.clamp(1, cap));
            retry(delay)
        }
        AttemptResult::Status {
            code: 400..=499, ..
        } => Outcome::DeadLetter,
        AttemptResult::Status { .. } | AttemptResult::Timeout | AttemptResult::NetworkError => {
            retry(scheduled_delay(schedule, attempt))
        }
    }
}

/// The delay for the next queue hop when `remaining_s` is still to wait:
/// `min(remaining_s, MAX_QUEUE_DELAY_S)`, so delays longer than the queue
/// maximum are chained (the consumer re-enqueues until `not_before`).
pub fn next_hop(remaining_s: u64) -> u64 {
    remaining_s.min(MAX_QUEUE_DELAY_S)
}

/// A `Retry-After` value as seconds from now: delta-seconds (`120`) or an
/// HTTP-date (`Wed, 21 Oct 2015 07:28:00 GMT`, read as RFC 2822). A date in
/// the past is 0. `None` when the value is neither.
pub fn parse_retry_after(v: &str, now_ms: u64) -> Option<u64> {
    let v = v.trim_matches([' ', '\t']);
    if v.is_empty() {
        return None;
    }
    if v.bytes().all(|b| b.is_ascii_digit()) {
        // All digits but too large for u64 is still "a very long time".
        return Some(v.parse::<u64>().unwrap_or(u64::MAX));
    }
    let rfc2822 = &time::format_description::well_known::Rfc2822;
    let at = time::OffsetDateTime::parse(v, rfc2822).ok()?;
    let at_ms = u64::try_from(at.unix_timestamp()).map_or(0, |s| s.saturating_mul(1000));
    Some(at_ms.saturating_sub(now_ms).div_ceil(1000))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const DEFAULT: &[u32] = &[60, 900, 3_600, 86_400];
    // 2015-10-21T07:28:00Z
    const NOW_MS: u64 = 1_445_412_480_000;

    fn status(code: u16) -> AttemptResult {
        AttemptResult::Status {
            code,
            retry_after: None,
        }
    }

    fn too_many(retry_after: &str) -> AttemptResult {
        AttemptResult::Status {
            code: 429,
            retry_after: Some(retry_after.to_string()),
        }
    }

    #[test]
    fn default_schedule_is_five_attempts() {
        assert_eq!(max_attempts(DEFAULT), 5);
        assert_eq!(max_attempts(&[]), 1);
        let got: Vec<Outcome> = (1..=5)
            .map(|a| classify(&status(503), a, DEFAULT, NOW_MS))
            .collect();
        assert_eq!(
            got,
            vec![
                Outcome::Retry { delay_s: 60 },
                Outcome::Retry { delay_s: 900 },
                Outcome::Retry { delay_s: 3_600 },
                Outcome::Retry { delay_s: 86_400 },
                Outcome::DeadLetter,
            ]
        );
        // A manual retry beyond the schedule that fails again dead-letters.
        assert_eq!(
            classify(&status(500), 6, DEFAULT, NOW_MS),
            Outcome::DeadLetter
        );
        assert_eq!(classify(&status(500), 1, &[], NOW_MS), Outcome::DeadLetter);
    }

    #[test]
    fn outcomes_by_result() {
        for code in [200, 201, 202, 204, 299] {
            assert_eq!(
                classify(&status(code), 1, DEFAULT, NOW_MS),
                Outcome::Delivered
            );
            assert_eq!(
                classify(&status(code), 9, DEFAULT, NOW_MS),
                Outcome::Delivered
            );
        }
        for code in [400, 401, 403, 404, 408, 409, 410, 413, 422, 499] {
            assert_eq!(
                classify(&status(code), 1, DEFAULT, NOW_MS),
                Outcome::DeadLetter,
                "{code}"
            );
        }
        for r in [
            status(100),
            status(301),
            status(302),
            status(304),
            status(500),
            status(502),
            status(599),
            status(600),
            AttemptResult::Timeout,
            AttemptResult::NetworkError,
        ] {
            assert_eq!(
                classify(&r, 2, DEFAULT, NOW_MS),
                Outcome::Retry { delay_s: 900 },
                "{r:?}"
            );
        }
    }

    #[test]
    fn too_many_requests_follows_retry_after_within_bounds() {
        let c = |r: &AttemptResult, attempt| classify(r, attempt, DEFAULT, NOW_MS);
        assert_eq!(c(&too_many("120"), 1), Outcome::Retry { delay_s: 120 });
        assert_eq!(c(&too_many(" 7 "), 3), Outcome::Retry { delay_s: 7 });
        assert_eq!(c(&too_many("0"), 1), Outcome::Retry { delay_s: 1 });
        assert_eq!(
            c(&too_many("999999"), 1),
            Outcome::Retry { delay_s: 86_400 }
        );
        assert_eq!(
            c(&too_many("99999999999999999999999"), 1),
            Outcome::Retry { delay_s: 86_400 }
        );
        assert_eq!(
            c(&too_many("Wed, 21 Oct 2015 07:28:30 GMT"), 1),
            Outcome::Retry { delay_s: 30 }
        );
        assert_eq!(
            c(&too_many("Wed, 21 Oct 2015 07:00:00 GMT"), 1),
            Outcome::Retry { delay_s: 1 }
        );
        // Missing or unreadable: the schedule.
        assert_eq!(c(&status(429), 2), Outcome::Retry { delay_s: 900 });
        for bad in ["", "soon", "-5", "1.5", "Someday, 99 Foo 2015"] {
            assert_eq!(
                c(&too_many(bad), 2),
                Outcome::Retry { delay_s: 900 },
                "{bad:?}"
            );
        }
        // Still bounded by the number of attempts.
        assert_eq!(c(&too_many("5"), 5), Outcome::DeadLetter);
    }

    #[test]
    fn retry_after_values() {
        assert_eq!(parse_retry_after("120", NOW_MS), Some(120));
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", NOW_MS),
            Some(0)
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:29:00 GMT", NOW_MS),
            Some(60)
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", NOW_MS - 1),
            Some(1)
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 09:28:00 +0200", NOW_MS),
            Some(0)
        );
        assert_eq!(
            parse_retry_after("Thu, 01 Jan 1970 00:00:00 GMT", NOW_MS),
            Some(0)
        );
        assert_eq!(parse_retry_after("", NOW_MS), None);
        assert_eq!(parse_retry_after("later", NOW_MS), None);
        assert_eq!(parse_retry_after("+5", NOW_MS), None);
    }

    #[test]
    fn long_delays_are_chained_through_the_queue() {
        assert_eq!(next_hop(0), 0);
        assert_eq!(next_hop(60), 60);
        assert_eq!(next_hop(43_200), 43_200);
        assert_eq!(next_hop(86_400), 43_200);
        assert_eq!(next_hop(u64::MAX), MAX_QUEUE_DELAY_S);
    }

    fn any_result() -> impl Strategy<Value = AttemptResult> {
        let retry_after = proptest::option::of(prop_oneof![
            "[0-9]{1,25}",
            "\\PC{0,30}",
            (0i64..4_000_000_000).prop_map(|s| {
                chrono::DateTime::from_timestamp(s, 0)
                    .unwrap()
                    .format("%a, %d %b %Y %H:%M:%S GMT")
                    .to_string()
            }),
        ]);
        prop_oneof![
            (0u16..1000, retry_after)
                .prop_map(|(code, retry_after)| AttemptResult::Status { code, retry_after }),
            (429u16..430, proptest::option::of("[0-9]{1,8}"))
                .prop_map(|(code, retry_after)| AttemptResult::Status { code, retry_after }),
            Just(AttemptResult::Timeout),
            Just(AttemptResult::NetworkError),
        ]
    }

    fn any_schedule() -> impl Strategy<Value = Vec<u32>> {
        proptest::collection::vec(1u32..=604_800, 0..=20)
    }

    proptest! {
        #[test]
        fn a_delivery_ends_within_max_attempts(
            schedule in any_schedule(),
            results in proptest::collection::vec(any_result(), 21),
            now_ms in 0u64..8_000_000_000_000,
        ) {
            let max = max_attempts(&schedule);
            let cap = u64::from(schedule.iter().copied().max().unwrap_or(1));
            let mut attempt = 1u32;
            let end = loop {
                let i = usize::try_from(attempt - 1).unwrap();
                match classify(&results[i], attempt, &schedule, now_ms) {
                    Outcome::Retry { delay_s } => {
                        prop_assert!((1..=cap).contains(&delay_s), "delay {} cap {}", delay_s, cap);
                        attempt += 1;
                        prop_assert!(attempt <= max, "attempt {} > max {}", attempt, max);
                    }
                    done => break done,
                }
            };
            prop_assert!(matches!(end, Outcome::Delivered | Outcome::DeadLetter));
            prop_assert!(attempt <= max);
        }

        #[test]
        fn status_classes_are_final(
            schedule in any_schedule(),
            attempt in 0u32..30,
            code in 200u16..300,
            refused in (400u16..500).prop_filter("not 429", |c| *c != 429),
            retry_after in proptest::option::of("\\PC{0,20}"),
        ) {
            let ok = AttemptResult::Status { code, retry_after: retry_after.clone() };
            prop_assert_eq!(classify(&ok, attempt, &schedule, 0), Outcome::Delivered);
            let no = AttemptResult::Status { code: refused, retry_after };
            prop_assert_eq!(classify(&no, attempt, &schedule, 0), Outcome::DeadLetter);
        }

        #[test]
        fn chained_hops_add_up(total in 0u64..10_000_000) {
            let (mut left, mut sum, mut hops) = (total, 0u64, 0u64);
            while left > 0 {
                let hop = next_hop(left);
                prop_assert!((1..=MAX_QUEUE_DELAY_S).contains(&hop));
                left -= hop;
                sum += hop;
                hops += 1;
            }
            prop_assert_eq!(sum, total);
            prop_assert_eq!(hops, total.div_ceil(MAX_QUEUE_DELAY_S));
        }

        #[test]
        fn parse_retry_after_never_panics(v in "\\PC{0,40}", now in any::<u64>()) {
            let _ = parse_retry_after(&v, now);
        }
    }
}
