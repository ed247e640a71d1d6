//! Per-key rate limiting: an anchored fixed window.
//!
//! A key's whole state is one [`Window`]: when its current window started and
//! how much of the quota it has used. A window opens at the first request after
//! the previous one ended and lasts `window_ms`; within it, admitted cost never
//! exceeds the quota. Anchoring the window on the key's own first request (not
//! on the wall-clock minute) keeps keys from resetting in lock-step and makes a
//! burst that fits in one window see exactly `limit` admissions.
//!
//! See `docs/adr/0002-rate-limit-algorithm.md` for why not GCRA or a sliding log.

use std::num::{NonZeroU32, NonZeroU64};

use serde::{Deserialize, Serialize};

/// One minute in ms (a `match`: `unwrap` is refused outside tests; 60 000
/// is not zero, so the other arm is never taken).
const MINUTE_MS: NonZeroU64 = match NonZeroU64::new(60_000) {
    Some(ms) => ms,
    None => NonZeroU64::MAX,
};

/// A plan's quota: at most `limit` cost units per window of `window_ms`.
///
/// Neither can be zero, so no caller has to cope with one: a zero limit
/// would refuse everything and a zero window would last no time (the
/// limiter used to stretch it to 1 ms). governor's `Quota` holds the same
/// rule. The fields are private; build one with
/// [`Quota::new`]. On the wire between the worker and the key's object it
/// stays `{"limit": N, "window_ms": M}`, and a zero in either is refused
/// when read, as any malformed field is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quota {
    limit: NonZeroU32,
    window_ms: NonZeroU64,
}

impl Quota {
    /// `limit` units per `window_ms`; `None` if either is zero.
    pub const fn new(limit: u32, window_ms: u64) -> Option<Quota> {
        match (NonZeroU32::new(limit), NonZeroU64::new(window_ms)) {
            (Some(limit), Some(window_ms)) => Some(Quota { limit, window_ms }),
            _ => None,
        }
    }

    /// `limit` units per minute.
    pub const fn per_minute(limit: NonZeroU32) -> Quota {
        Quota {
            limit,
            window_ms: MINUTE_MS,
        }
    }

    /// What a field that must hold a quota carries when none applies: the
    /// legacy `guard::AdmitRequest::quota` beside `limits` that name no
    /// policy. No build that reads `limits` enforces it (one unit per ms).
    pub const PLACEHOLDER: Quota = Quota {
        limit: NonZeroU32::MIN,
        window_ms: NonZeroU64::MIN,
    };

    /// The cost units a window admits (at least 1).
    pub const fn limit(self) -> u32 {
        self.limit.get()
    }

    /// The window's length in ms (at least 1).
    pub const fn window_ms(self) -> u64 {
        self.window_ms.get()
    }
}

/// The persisted state of one key's limiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Window {
    pub start_ms: u64,
    pub used: u32,
}

/// What the limiter decided, with everything the response headers need.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    pub admitted: bool,
    pub limit: u32,
    pub remaining: u32,
    /// When the current window ends (epoch ms).
    pub reset_ms: u64,
    /// Seconds from `now` until the window ends, rounded up (`t` of `RateLimit`).
    pub reset_in_s: u64,
    /// Unix seconds of the reset as sent in `X-RateLimit-Reset` (`now_s + t`).
    pub reset_epoch_s: u64,
    pub window_s: u64,
}

impl Verdict {
    /// `Retry-After` for a rejected request: the window end, rounded up, so a
    /// client that waits exactly this long is admitted (cost ≤ limit is a
    /// configuration invariant).
    pub fn retry_after_s(&self) -> u64 {
        self.reset_in_s.max(1)
    }
}

fn ceil_div(a: u64, b: u64) -> u64 {
    a.div_ceil(b)
}

impl Window {
    /// What the object loads when its stored window cannot be read: a window
    /// "from the future" with the quota used up, which [`check`] pins to the
    /// current instant. Unreadable state fails closed for one window, then
    /// heals (it never reopens a full window).
    pub const UNREADABLE: Window = Window {
        start_ms: u64::MAX,
        used: u32::MAX,
    };
}

/// The window in force at `now_ms`, if any. The clock may step back: a
/// window that started "after" `now_ms` is still in force (a backward step
/// never reopens the quota), and one that starts more than a window ahead
/// (a stored window from the future, or [`Window::UNREADABLE`]) is pinned to
/// `now_ms` with its usage kept, so it ends at most one window from now.
pub(crate) fn in_force(state: Option<Window>, now_ms: u64, window_ms: u64) -> Option<Window> {
    let w = state?;
    let w = match w.start_ms > now_ms.saturating_add(window_ms) {
        true => Window {
            start_ms: now_ms,
            used: w.used,
        },
        false => w,
    };
    (now_ms < w.start_ms.saturating_add(window_ms)).then_some(w)
}

/// Checks a request of `cost` against the key's window at `now_ms`.
///
/// Returns the new state (unchanged for a rejection or a zero cost, unless a
/// window from the future was pinned to now) and the verdict. Pure: the
/// caller persists the state.
pub fn check(
    state: Option<Window>,
    quota: Quota,
    now_ms: u64,
    cost: u32,
) -> (Option<Window>, Verdict) {
    check_limit(state, quota.limit(), quota.window_ms, now_ms, cost)
}

/// [`check`] of a limit of zero, which a [`Quota`] cannot hold: only a cost
/// of 0 (a peek) is admitted, and the verdict still tells when the window
/// resets, so a refused client waits a window rather than retrying at once.
/// A key's overrides written for its plan's earlier form can resolve to such
/// a policy (`config::Plan::limits`); validation refuses it everywhere else.
pub fn check_closed(
    state: Option<Window>,
    window_ms: NonZeroU64,
    now_ms: u64,
    cost: u32,
) -> (Option<Window>, Verdict) {
    check_limit(state, 0, window_ms, now_ms, cost)
}

fn check_limit(
    state: Option<Window>,
    limit: u32,
    window_ms: NonZeroU64,
    now_ms: u64,
    cost: u32,
) -> (Option<Window>, Verdict) {
    let window_ms = window_ms.get();
    let live = in_force(state, now_ms, window_ms);
    let (start_ms, used) = match live {
        Some(w) => (w.start_ms, w.used),
        None => (now_ms, 0),
    };
    let admitted = u64::from(used) + u64::from(cost) <= u64::from(limit);
    let used_after = if admitted { used + cost } else { used };
    let reset_ms = start_ms.saturating_add(window_ms);
    let reset_in_s = ceil_div(reset_ms.saturating_sub(now_ms), 1000);
    let verdict = Verdict {
        admitted,
        limit,
        remaining: limit.saturating_sub(used_after),
        reset_ms,
        reset_in_s,
        reset_epoch_s: now_ms / 1000 + reset_in_s,
        window_s: ceil_div(window_ms, 1000),
    };
    let pinned = live.filter(|w| Some(*w) != state);
    let new_state = if admitted && cost > 0 {
        Some(Window {
            start_ms,
            used: used_after,
        })
    } else if pinned.is_some() {
        pinned
    } else {
        state
    };
    (new_state, verdict)
}

/// The rate-limit response headers of docs/request-path.md, in order.
pub fn headers(v: &Verdict) -> Vec<(&'static str, String)> {
    headers_of(v, "default")
}

/// [`headers`] of the policy called `policy` (e.g. `"unauthenticated"`, the
/// per-IP limit of requests without a valid credential).
pub fn headers_of(v: &Verdict, policy: &str) -> Vec<(&'static str, String)> {
    vec![
        ("X-RateLimit-Limit", v.limit.to_string()),
        ("X-RateLimit-Remaining", v.remaining.to_string()),
        ("X-RateLimit-Reset", v.reset_epoch_s.to_string()),
        (
            "RateLimit-Policy",
            format!("\"{policy}\";q={};w={}", v.limit, v.window_s),
        ),
        (
            "RateLimit",
            format!("\"{policy}\";r={};t={}", v.remaining, v.reset_in_s),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const Q: Quota = Quota::new(3, 60_000).unwrap();

    #[test]
    fn a_quota_is_never_zero_and_keeps_its_wire_form() {
        assert_eq!(Quota::new(0, 60_000), None);
        assert_eq!(Quota::new(3, 0), None);
        assert_eq!((Q.limit(), Q.window_ms()), (3, 60_000));
        let text = serde_json::to_string(&Q).unwrap();
        assert_eq!(text, r#"{"limit":3,"window_ms":60000}"#);
        assert_eq!(serde_json::from_str::<Quota>(&text).unwrap(), Q);
        for zero in [
            r#"{"limit":0,"window_ms":60000}"#,
            r#"{"limit":3,"window_ms":0}"#,
        ] {
            assert!(serde_json::from_str::<Quota>(zero).is_err(), "{zero}");
        }
        let minute = Quota::per_minute(std::num::NonZeroU32::MIN);
        assert_eq!((minute.limit(), minute.window_ms()), (1, 60_000));
    }

    #[test]
    fn admits_limit_then_rejects_until_reset() {
        let mut st = None;
        for expected_remaining in [2, 1, 0] {
            let (s, v) = check(st, Q, 1_000, 1);
            assert!(v.admitted);
            assert_eq!(v.remaining, expected_remaining);
            st = s;
        }
        let (s, v) = check(st, Q, 30_500, 1);
        assert!(!v.admitted);
        assert_eq!(v.remaining, 0);
        assert_eq!(v.reset_ms, 61_000);
        assert_eq!(v.reset_in_s, 31); // 30.5 s rounded up
        assert_eq!(v.retry_after_s(), 31);
        assert_eq!(v.reset_epoch_s, 30 + 31);
        assert_eq!(s, st, "a rejection does not change state");
        // At the reset instant the window has ended: admitted again.
        let (_, v) = check(st, Q, 61_000, 1);
        assert!(v.admitted);
        assert_eq!(v.remaining, 2);
        assert_eq!(v.reset_ms, 121_000);
    }

    #[test]
    fn cost_counts_and_zero_cost_only_peeks() {
        let (st, v) = check(None, Q, 0, 2);
        assert_eq!(v.remaining, 1);
        let (st2, v) = check(st, Q, 10, 0);
        assert!(v.admitted);
        assert_eq!(v.remaining, 1);
        assert_eq!(st2, st);
        let (_, v) = check(st, Q, 10, 2);
        assert!(!v.admitted, "2 + 2 > 3");
        let (none, v) = check(None, Q, 5_000, 0);
        assert_eq!(none, None);
        assert_eq!(v.remaining, 3);
        assert_eq!(v.reset_in_s, 60);
    }

    #[test]
    fn headers_follow_the_contract_shape() {
        let (_, v) = check(None, Quota::new(60, 60_000).unwrap(), 1_716_392_400_000, 13);
        let h = headers(&v);
        assert_eq!(h[0], ("X-RateLimit-Limit", "60".into()));
        assert_eq!(h[1], ("X-RateLimit-Remaining", "47".into()));
        assert_eq!(h[2], ("X-RateLimit-Reset", "1716392460".into()));
        assert_eq!(h[3], ("RateLimit-Policy", "\"default\";q=60;w=60".into()));
        assert_eq!(h[4], ("RateLimit", "\"default\";r=47;t=60".into()));
    }

    #[test]
    fn quota_change_takes_effect_within_the_window() {
        let (st, _) = check(None, Q, 0, 3);
        let bigger = Quota::new(5, 60_000).unwrap();
        let (_, v) = check(st, bigger, 1, 1);
        assert!(v.admitted);
        assert_eq!(v.remaining, 1);
    }

    proptest! {
        /// In every window the limiter opened, the admitted cost never exceeds
        /// the quota, whatever the arrival pattern and costs.
        #[test]
        fn never_admits_more_than_the_quota_per_window(
            limit in 1u32..50,
            window_s in 1u64..120,
            steps in proptest::collection::vec((0u64..5_000, 0u32..4), 1..400),
        ) {
            let quota = Quota::new(limit, window_s * 1000).unwrap();
            let mut st = None;
            let mut now = 1_700_000_000_000u64;
            let mut per_window: std::collections::BTreeMap<u64, u64> = Default::default();
            for (dt, cost) in steps {
                now += dt;
                let cost = cost.min(limit);
                let (s, v) = check(st, quota, now, cost);
                if v.admitted {
                    let start = v.reset_ms - quota.window_ms();
                    prop_assert!(start <= now && now < v.reset_ms);
                    *per_window.entry(start).or_default() += u64::from(cost);
                }
                prop_assert_eq!(v.reset_epoch_s, now / 1000 + v.reset_in_s);
                prop_assert!(v.remaining <= limit);
                st = s;
            }
            for (start, total) in per_window {
                prop_assert!(total <= u64::from(limit), "window {} admitted {}", start, total);
            }
        }

        /// Windows never overlap: a new one opens only after the previous ends.
        #[test]
        fn windows_do_not_overlap(steps in proptest::collection::vec(0u64..3_000, 1..200)) {
            let quota = Quota::new(2, 2_000).unwrap();
            let mut st: Option<Window> = None;
            let mut now = 0u64;
            for dt in steps {
                now += dt;
                let (s, _) = check(st, quota, now, 1);
                if let (Some(old), Some(new)) = (st, s) {
                    if new.start_ms != old.start_ms {
                        prop_assert!(new.start_ms >= old.start_ms + quota.window_ms());
                    }
                }
                st = s;
            }
        }

        /// Retry-After is honest: waiting exactly that long gets the request admitted,
        /// and it is never earlier than the moment admission becomes possible.
        #[test]
        fn retry_after_is_honest(limit in 1u32..20, window_s in 1u64..100, offset in 0u64..100_000, cost in 1u32..5) {
            let quota = Quota::new(limit, window_s * 1000).unwrap();
            let cost = cost.min(limit);
            let (st, _) = check(None, quota, 0, limit);
            let now = offset % quota.window_ms();
            let (_, v) = check(st, quota, now, cost);
            prop_assert!(!v.admitted);
            let later = now + v.retry_after_s() * 1000;
            let (_, v2) = check(st, quota, later, cost);
            prop_assert!(v2.admitted);
            // One millisecond before the window ends, it would still be rejected.
            if v.reset_ms > now + 1 {
                let (_, v3) = check(st, quota, v.reset_ms - 1, cost);
                prop_assert!(!v3.admitted);
            }
        }

        /// A clock that moves both ways (steps back, jumps ahead less than a
        /// window): over any sequence of instants spanning less than one
        /// window, the admitted cost never exceeds the quota.
        #[test]
        fn backward_clock_never_reopens_the_window(
            limit in 1u32..20,
            window_s in 1u64..120,
            steps in proptest::collection::vec((any::<bool>(), 0u64..10_000, 0u32..4), 1..300),
        ) {
            let quota = Quota::new(limit, window_s * 1000).unwrap();
            let base = 1_700_000_000_000u64;
            let mut st = None;
            let mut total = 0u64;
            for (back, d, cost) in steps {
                // Any instant in [base, base + window): forward or backward steps.
                let off = d % quota.window_ms();
                let now = if back { base + quota.window_ms() - 1 - off } else { base + off };
                let cost = cost.min(limit);
                let (s, v) = check(st, quota, now, cost);
                if v.admitted { total += u64::from(cost); }
                prop_assert!(v.remaining <= limit);
                st = s;
            }
            prop_assert!(total <= u64::from(limit), "admitted {} of {}", total, limit);
        }

        /// A stored window from the future (or unreadable state) keeps its
        /// usage: whatever the clock then does within a window, no more than
        /// the rest of the quota is admitted, and it ends within one window.
        #[test]
        fn window_from_the_future_keeps_its_usage(
            limit in 1u32..20,
            used in 0u32..25,
            ahead in 0u64..10_000_000_000,
            steps in proptest::collection::vec(0u64..60_000, 1..100),
        ) {
            let quota = Quota::new(limit, 60_000).unwrap();
            let now0 = 1_700_000_000_000u64;
            let mut st = Some(Window { start_ms: now0.saturating_add(ahead), used });
            let mut total = 0u64;
            for d in steps {
                let now = now0 + d / 2;
                let (s, v) = check(st, quota, now, 1);
                if v.admitted { total += 1; }
                prop_assert!(v.reset_ms <= now0.saturating_add(ahead).max(now) + 2 * quota.window_ms());
                st = s;
            }
            prop_assert!(total <= u64::from(limit.saturating_sub(used)));
            let (_, v) = check(Some(Window::UNREADABLE), quota, now0, 1);
            prop_assert!(!v.admitted);
            prop_assert!(v.reset_ms == now0 + quota.window_ms());
        }

        /// Within one window, each admitted request sees its own Remaining.
        #[test]
        fn remaining_counts_down_one_by_one(limit in 1u32..100) {
            let quota = Quota::new(limit, 60_000).unwrap();
            let mut st = None;
            for i in 0..limit {
                let (s, v) = check(st, quota, u64::from(i), 1);
                prop_assert!(v.admitted);
                prop_assert_eq!(v.remaining, limit - i - 1);
                st = s;
            }
            let (_, v) = check(st, quota, u64::from(limit), 1);
            prop_assert!(!v.admitted);
        }
    }
}
