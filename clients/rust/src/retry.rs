//! The retry rule, as pure functions: which outcomes are retried and how long to wait.
//!
//! 429 and 409 `IDEMPOTENCY_KEY_IN_PROGRESS` were not executed: always retried. A lost
//! answer and 502/503/504 may have been executed: retried only when a second attempt cannot
//! run the operation twice ([`replay_safe`]: a safe method, or a call carrying an
//! Idempotency-Key, which the gateway answers with the stored result). A mutating call
//! without a key is never retried after such a failure.
//!
//! `delay = max(Retry-After, base) · 2^attempt + jitter(0..30 %)`, capped at
//! `max_delay`; `Retry-After` is a floor that the cap never lowers. A server that asks
//! for more than `max_delay` is not waited for: the call fails with that answer, so a
//! caller is never parked for longer than it configured.

use std::time::Duration;

use crate::clock::Random;

/// How a call is retried. The defaults suit an interactive client.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Attempts in total, the first included (1 = never retry).
    pub max_attempts: u32,
    /// The delay before the first retry when the server gave no `Retry-After`.
    pub base_delay: Duration,
    /// No single wait is longer than this (unless `Retry-After` demands more, see module doc).
    pub max_delay: Duration,
    /// Jitter as a fraction of the exponential delay, drawn uniformly from `0..jitter`.
    pub jitter: f64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(60),
            jitter: 0.3,
        }
    }
}

impl RetryPolicy {
    /// A policy that never retries.
    pub fn none() -> Self {
        RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        }
    }
}

/// What an attempt ended with, as far as the retry rule cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome<'a> {
    /// Connection refused or reset, timeout, a response cut short.
    Transport,
    /// An HTTP answer with its problem `code`, if the body was problem+json.
    Status { status: u16, code: Option<&'a str> },
}

/// Whether a second attempt of a call is harmless when the first may have run: a safe
/// method (`GET`, `HEAD`, `OPTIONS`), or a call that carries an Idempotency-Key.
pub fn replay_safe(method: &reqwest::Method, has_idempotency_key: bool) -> bool {
    use reqwest::Method;
    has_idempotency_key || matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// Whether an outcome is worth another attempt of a call that is (or is not)
/// [`replay_safe`].
pub fn is_retryable(outcome: Outcome<'_>, replay_safe: bool) -> bool {
    match outcome {
        Outcome::Transport => replay_safe,
        Outcome::Status { status, code } => match status {
            429 => true,
            409 => code == Some("IDEMPOTENCY_KEY_IN_PROGRESS"),
            502..=504 => replay_safe,
            _ => false,
        },
    }
}

/// The wait before retry number `attempt` (0 = the first retry), for a uniform
/// `unit` in `[0, 1)`.
pub fn backoff_delay(
    policy: &RetryPolicy,
    attempt: u32,
    retry_after: Option<Duration>,
    unit: f64,
) -> Duration {
    let floor = retry_after.unwrap_or(Duration::ZERO);
    let base = floor.max(policy.base_delay);
    // 2^attempt saturates long before u32 overflows: the cap applies anyway.
    let factor = 1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX);
    let exp = base.saturating_mul(factor);
    let share = (policy.jitter * unit.clamp(0.0, 1.0)).clamp(0.0, 1.0);
    let jitter = Duration::try_from_secs_f64(exp.as_secs_f64() * share).unwrap_or(Duration::MAX);
    exp.saturating_add(jitter).min(policy.max_delay).max(floor)
}

/// What to do after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Wait this long, then send again with the same Idempotency-Key.
    RetryAfter(Duration),
    /// Stop and return the error.
    GiveUp,
}

/// Decides after the attempt numbered `attempt` (0 = the first one) of a call that is (or
/// is not) [`replay_safe`] failed with `outcome`.
pub fn decide(
    policy: &RetryPolicy,
    attempt: u32,
    outcome: Outcome<'_>,
    retry_after: Option<Duration>,
    replay_safe: bool,
    random: &dyn Random,
) -> Decision {
    if !is_retryable(outcome, replay_safe) || attempt.saturating_add(1) >= policy.max_attempts {
        return Decision::GiveUp;
    }
    if retry_after.is_some_and(|ra| ra > policy.max_delay) {
        return Decision::GiveUp;
    }
    Decision::RetryAfter(backoff_delay(policy, attempt, retry_after, random.unit()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A random source that returns a fixed sequence (then repeats the last value).
    struct Fixed(Mutex<Vec<f64>>);
    impl Fixed {
        fn new(v: &[f64]) -> Self {
            let mut v = v.to_vec();
            v.reverse();
            Fixed(Mutex::new(v))
        }
    }
    impl Random for Fixed {
        fn unit(&self) -> f64 {
            let mut v = self.0.lock().unwrap();
            if v.len() > 1 {
                v.pop().unwrap()
            } else {
                v[0]
            }
        }
    }

    /// A fake clock that only moves when something sleeps on it; it records the sleeps.
    #[derive(Default)]
    struct FakeClock {
        now: Mutex<Duration>,
        sleeps: Mutex<Vec<Duration>>,
    }
    impl FakeClock {
        fn sleep(&self, d: Duration) {
            *self.now.lock().unwrap() += d;
            self.sleeps.lock().unwrap().push(d);
        }
    }

    fn policy() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 10,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(60),
            jitter: 0.3,
        }
    }

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn exponential_without_jitter() {
        let p = policy();
        let got: Vec<_> = (0..5).map(|a| backoff_delay(&p, a, None, 0.0)).collect();
        assert_eq!(got, vec![MS(100), MS(200), MS(400), MS(800), MS(1600)]);
    }

    #[test]
    fn jitter_stays_within_zero_to_thirty_percent() {
        let p = policy();
        for attempt in 0..8 {
            let exp = MS(100) * (1 << attempt);
            for i in 0..=100 {
                let unit = f64::from(i) / 100.0 * 0.999_999;
                let d = backoff_delay(&p, attempt, None, unit);
                assert!(d >= exp, "attempt {attempt}: {d:?} < {exp:?}");
                assert!(
                    d <= exp.mul_f64(1.3),
                    "attempt {attempt}: {d:?} > 1.3 × {exp:?}"
                );
            }
            // The extremes are reached: 0 % and (almost) 30 %.
            assert_eq!(backoff_delay(&p, attempt, None, 0.0), exp);
            let top = backoff_delay(&p, attempt, None, 0.999_999);
            assert!(top > exp.mul_f64(1.299), "attempt {attempt}: {top:?}");
        }
    }

    #[test]
    fn capped_at_max_delay() {
        let p = policy();
        assert_eq!(backoff_delay(&p, 20, None, 0.9), Duration::from_secs(60));
        assert_eq!(
            backoff_delay(&p, u32::MAX, None, 0.5),
            Duration::from_secs(60)
        );
        // 100 ms · 2^9 = 51.2 s, + 30 % would be 66.6 s: the jitter does not break the cap.
        assert_eq!(backoff_delay(&p, 9, None, 0.999), Duration::from_secs(60));
    }

    #[test]
    fn retry_after_is_a_floor_and_the_base_of_the_exponent() {
        let p = policy();
        let ra = Some(Duration::from_secs(3));
        assert_eq!(backoff_delay(&p, 0, ra, 0.0), Duration::from_secs(3));
        assert_eq!(backoff_delay(&p, 2, ra, 0.0), Duration::from_secs(12));
        let d = backoff_delay(&p, 1, ra, 0.5);
        assert_eq!(d, Duration::from_secs_f64(6.0 * 1.15));
        // A Retry-After at the cap is honoured even though the exponent exceeds it.
        let at_cap = Some(Duration::from_secs(60));
        assert_eq!(backoff_delay(&p, 3, at_cap, 0.9), Duration::from_secs(60));
        // Below the base, the base wins; never below Retry-After.
        let tiny = Some(MS(10));
        assert_eq!(backoff_delay(&p, 0, tiny, 0.0), MS(100));
        let low_cap = RetryPolicy {
            max_delay: MS(50),
            ..policy()
        };
        assert_eq!(backoff_delay(&low_cap, 4, Some(MS(80)), 0.0), MS(80));
    }

    #[test]
    fn which_outcomes_are_retried() {
        for s in [429, 502, 503, 504] {
            assert!(is_retryable(
                Outcome::Status {
                    status: s,
                    code: None
                },
                true
            ));
        }
        assert!(is_retryable(Outcome::Transport, true));
        assert!(is_retryable(
            Outcome::Status {
                status: 409,
                code: Some("IDEMPOTENCY_KEY_IN_PROGRESS")
            },
            false
        ));
        for (s, code) in [
            (400, Some("VALIDATION_ERROR")),
            (401, Some("INVALID_API_KEY")),
            (403, Some("FORBIDDEN")),
            (404, None),
            (409, None),
            (413, Some("PAYLOAD_TOO_LARGE")),
            (422, Some("IDEMPOTENCY_KEY_REUSE_CONFLICT")),
            (500, None),
            (501, None),
        ] {
            for safe in [true, false] {
                assert!(
                    !is_retryable(Outcome::Status { status: s, code }, safe),
                    "{s} {code:?}"
                );
            }
        }
    }

    /// Issue 23 item 1: a mutating call without an Idempotency-Key is not sent again after
    /// an answer that may have been executed; 429 was not executed and is retried anyway.
    #[test]
    fn no_key_no_retry_of_a_mutating_call() {
        use reqwest::Method;
        let unsafe_post = replay_safe(&Method::POST, false);
        assert!(!unsafe_post);
        assert!(replay_safe(&Method::POST, true));
        assert!(replay_safe(&Method::DELETE, true));
        assert!(!replay_safe(&Method::PATCH, false));
        assert!(replay_safe(&Method::GET, false));
        let r = Fixed::new(&[0.0]);
        let p = policy();
        for outcome in [
            Outcome::Transport,
            Outcome::Status {
                status: 502,
                code: None,
            },
            Outcome::Status {
                status: 503,
                code: Some("ORIGIN_UNREACHABLE"),
            },
            Outcome::Status {
                status: 504,
                code: None,
            },
        ] {
            assert_eq!(
                decide(&p, 0, outcome, None, unsafe_post, &r),
                Decision::GiveUp,
                "{outcome:?}"
            );
            assert_eq!(
                decide(&p, 0, outcome, None, true, &r),
                Decision::RetryAfter(MS(100)),
                "{outcome:?}"
            );
        }
        let busy = Outcome::Status {
            status: 429,
            code: Some("RATE_LIMIT_EXCEEDED"),
        };
        assert_eq!(
            decide(&p, 0, busy, Some(MS(1000)), unsafe_post, &r),
            Decision::RetryAfter(MS(1000))
        );
    }

    /// The whole schedule of one call that keeps failing, on a fake clock: the sleeps
    /// follow the rule, the attempts are bounded, the total is what the clock advanced.
    #[test]
    fn schedule_on_a_fake_clock() {
        let clock = FakeClock::default();
        let random = Fixed::new(&[0.0, 0.5, 0.999_999, 0.25]);
        let p = RetryPolicy {
            max_attempts: 6,
            ..policy()
        };
        let retry_afters = [None, Some(Duration::from_secs(1)), None, None, None, None];
        let mut attempts = 0;
        for (attempt, ra) in (0u32..).zip(retry_afters) {
            attempts += 1;
            let outcome = Outcome::Status {
                status: 503,
                code: None,
            };
            match decide(&p, attempt, outcome, ra, true, &random) {
                Decision::RetryAfter(d) => clock.sleep(d),
                Decision::GiveUp => break,
            }
        }
        assert_eq!(attempts, 6, "bounded by max_attempts");
        let sleeps = clock.sleeps.lock().unwrap().clone();
        assert_eq!(sleeps.len(), 5);
        assert_eq!(sleeps[0], MS(100)); // base, no jitter
        assert_eq!(sleeps[1], Duration::from_secs_f64(2.0 * 1.15)); // Retry-After 1 s · 2^1 + 15 %
        assert!(sleeps[2] > MS(400).mul_f64(1.299) && sleeps[2] <= MS(400).mul_f64(1.3));
        assert_eq!(sleeps[3], MS(800).mul_f64(1.075));
        assert_eq!(sleeps[4], MS(1600).mul_f64(1.075));
        let total: Duration = sleeps.iter().sum();
        assert_eq!(*clock.now.lock().unwrap(), total);
    }

    #[test]
    fn gives_up_on_final_answers_and_excessive_retry_after() {
        let p = policy();
        let r = Fixed::new(&[0.0]);
        let conflict = Outcome::Status {
            status: 422,
            code: Some("IDEMPOTENCY_KEY_REUSE_CONFLICT"),
        };
        assert_eq!(decide(&p, 0, conflict, None, true, &r), Decision::GiveUp);
        let busy = Outcome::Status {
            status: 429,
            code: Some("RATE_LIMIT_EXCEEDED"),
        };
        let long = Some(Duration::from_secs(61));
        assert_eq!(decide(&p, 0, busy, long, true, &r), Decision::GiveUp);
        let ok = Some(Duration::from_secs(60));
        assert_eq!(
            decide(&p, 0, busy, ok, true, &r),
            Decision::RetryAfter(Duration::from_secs(60))
        );
        assert_eq!(
            decide(&RetryPolicy::none(), 0, busy, None, true, &r),
            Decision::GiveUp
        );
    }
}
