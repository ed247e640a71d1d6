//! Scheduled events (issue 36): `deliver_at` on a publish — no attempt before
//! it, at most [`MAX_AHEAD_MS`] ahead — and the first queue hop that carries
//! a delivery to it.
//!
//! A scheduled event is not a new mechanism: its deliveries are stored with
//! `next_attempt_at = deliver_at` instead of the publish time, and their
//! first job is [`delivery::Job::Scheduled`] at that time. A job identifies
//! its attempt by that planned time, and one that arrives early waits
//! another hop ([`delivery::plan`]'s `Wait`, each hop at most the queue's
//! 12 h, [`retry::next_hop`]): exactly the chaining the retry schedule's
//! 24 h step already uses. So a seven-day `deliver_at` is at most
//! fourteen hops, each one queue message, with no other state.
//!
//! Pure: the shell passes `now` (epoch ms).
//!
//! [`delivery::Job::Scheduled`]: super::delivery::Job::Scheduled
//! [`delivery::plan`]: super::delivery::plan

use super::retry;
use crate::Invalid;

/// How far ahead `deliver_at` may be: 7 days. Deliveries are kept 14 days
/// by default (`retention.deliveries_days`), so a scheduled event still has
/// its whole retry schedule (~25 h) and more before its shard is dropped;
/// and a scheduled event is a notice to a receiver, not a job scheduler.
pub const MAX_AHEAD_MS: u64 = 7 * 86_400_000;

/// The effective `deliver_at` of a publish at `now`: `None` (no
/// `deliver_at`) stays `None`; a time in the past (or now) is due at once
/// (`now`: the origin's clock may run a little ahead or behind ours, and an
/// event whose moment has passed is still worth delivering); more than
/// [`MAX_AHEAD_MS`] ahead is refused, naming the field, so an origin's
/// mistake (seconds for milliseconds, a wrong year) is a 400 rather than a
/// delivery that silently never comes.
pub fn deliver_at(requested: Option<u64>, now: u64) -> Result<Option<u64>, Invalid> {
    let Some(at) = requested else {
        return Ok(None);
    };
    if at > now.saturating_add(MAX_AHEAD_MS) {
        return Err(Invalid::field(
            "deliver_at",
            "must be at most 7 days ahead (epoch milliseconds or RFC 3339)",
        ));
    }
    Ok(Some(at.max(now)))
}

/// When a new delivery's first attempt is due, and so its stored
/// `next_attempt_at` (shown as such in the delivery log): the publish time,
/// or `deliver_at` when that is later. Never before the publish: a
/// delivery is due when it exists at the earliest.
pub fn first_attempt_at(created_at: u64, deliver_at: Option<u64>) -> u64 {
    deliver_at.map_or(created_at, |at| at.max(created_at))
}

/// The delay (seconds) of the first queue message of a delivery due at
/// `at`, sent at `now`: the whole wait up to the queue's maximum; what is
/// left is chained by the consumer (the job arrives early and waits another
/// hop). Rounded up, so the job never arrives before `at` but for the
/// consumer's one-second tolerance; 0 when already due.
pub fn first_hop_s(at: u64, now: u64) -> u64 {
    retry::next_hop(at.saturating_sub(now).div_ceil(1_000))
}

/// How many queue messages carry a delivery from `now` to `at` (the first
/// and each chained hop): what a scheduled event costs in queue operations.
pub fn hops(at: u64, now: u64) -> u64 {
    at.saturating_sub(now)
        .div_ceil(1_000)
        .div_ceil(retry::MAX_QUEUE_DELAY_S)
        .max(1)
}

#[cfg(test)]
mod tests {
    use super::super::delivery::{self, Delivery, Job, Plan, Status};
    use super::*;
    use proptest::prelude::*;

    const NOW: u64 = 1_800_000_000_000;

    #[test]
    fn deliver_at_is_bounded_and_the_past_is_now() {
        assert_eq!(deliver_at(None, NOW), Ok(None));
        assert_eq!(deliver_at(Some(NOW - 5_000), NOW), Ok(Some(NOW)));
        assert_eq!(deliver_at(Some(0), NOW), Ok(Some(NOW)));
        assert_eq!(deliver_at(Some(NOW + 60_000), NOW), Ok(Some(NOW + 60_000)));
        let last = NOW + MAX_AHEAD_MS;
        assert_eq!(deliver_at(Some(last), NOW), Ok(Some(last)));
        let err = deliver_at(Some(last + 1), NOW).unwrap_err();
        assert!(
            err.0.starts_with("deliver_at: must be at most 7 days"),
            "{err:?}"
        );
        assert!(deliver_at(Some(u64::MAX), u64::MAX - 1).is_ok());
    }

    #[test]
    fn the_first_attempt_is_never_before_the_publish() {
        assert_eq!(first_attempt_at(NOW, None), NOW);
        assert_eq!(first_attempt_at(NOW, Some(NOW + 9)), NOW + 9);
        assert_eq!(first_attempt_at(NOW, Some(NOW - 9)), NOW);
    }

    #[test]
    fn long_waits_are_chained_through_the_queue() {
        assert_eq!(first_hop_s(NOW, NOW), 0);
        assert_eq!(first_hop_s(NOW - 1, NOW), 0);
        assert_eq!(first_hop_s(NOW + 1, NOW), 1);
        assert_eq!(first_hop_s(NOW + 90_000, NOW), 90);
        assert_eq!(
            first_hop_s(NOW + MAX_AHEAD_MS, NOW),
            retry::MAX_QUEUE_DELAY_S
        );
        assert_eq!(hops(NOW, NOW), 1);
        assert_eq!(hops(NOW + 43_200_000, NOW), 1);
        assert_eq!(hops(NOW + 43_200_001, NOW), 2);
        assert_eq!(hops(NOW + MAX_AHEAD_MS, NOW), 14);
    }

    proptest! {
        /// A delivery due at `deliver_at`, driven by the state machine the
        /// consumer runs: its job waits hop after hop and is sent only once
        /// due (within the consumer's one-second tolerance), after exactly
        /// [`hops`] queue messages.
        #[test]
        fn no_attempt_before_deliver_at(
            ahead in 0u64..=MAX_AHEAD_MS,
            late_ms in 0u64..5_000,
        ) {
            let at = first_attempt_at(NOW, deliver_at(Some(NOW + ahead), NOW).unwrap());
            let d = Delivery {
                status: Status::Pending,
                attempts_made: 0,
                next_attempt_at: Some(at),
                subscribed: true,
                held: false,
                in_flight_until: None,
            };
            let job = Job::Scheduled { at };
            let mut now = NOW;
            let mut delay = first_hop_s(at, now);
            let mut messages = 1u64;
            loop {
                // The queue hands the message over at or a little after its delay.
                now += delay * 1_000 + late_ms;
                match delivery::plan(job, &d, now, 40_000) {
                    Plan::Wait { delay_s } => {
                        prop_assert!((1..=retry::MAX_QUEUE_DELAY_S).contains(&delay_s));
                        delay = delay_s;
                        messages += 1;
                    }
                    Plan::Send(_) => break,
                    other => prop_assert!(false, "unexpected {:?}", other),
                }
                prop_assert!(messages <= 20);
            }
            prop_assert!(now + 1_000 >= at, "sent at {} before {}", now, at);
            prop_assert!(messages <= hops(at, NOW) + 1, "{} messages, {} hops", messages, hops(at, NOW));
        }
    }
}
