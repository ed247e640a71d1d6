//! Quota notices (docs/webhooks.md "Quota notices"): a plan's `notify_at:
//! [percent, ...]` — when a key's use of a policy first reaches a threshold
//! in a window, the event `postguard.quota.threshold` is published to the
//! key's project. Decided here from the windows before and after one
//! admission, which the key's object runs one at a time: a threshold is
//! crossed by exactly one admission per window, so each notice is made once
//! however many requests arrive together. Its event id is derived from
//! (key, policy, window, threshold), so a retried publish is the same event.
//! A plan's `notify_at` is validated with the plans (`config::plans`).

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::limits::{window_of, Policy, Windows};
use crate::response_events::PendingEvent;

/// The event type of a quota notice.
pub const EVENT_TYPE: &str = "postguard.quota.threshold";

/// One threshold reached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notice {
    pub policy: String,
    pub limit: u32,
    pub used: u32,
    pub percent: u8,
    /// The window's first millisecond, and when it resets (epoch ms).
    pub window_start: u64,
    pub resets_at: u64,
}

/// The units at which `percent` of `limit` is reached (at least 1).
fn units(limit: u32, percent: u8) -> u64 {
    (u64::from(limit) * u64::from(percent)).div_ceil(100).max(1)
}

/// The thresholds an admission crossed: for each policy, each percent of
/// `notify_at` whose units the window had not reached before and has now
/// (a new window starts from 0).
pub fn crossed(
    notify_at: &[u8],
    policies: &[Policy],
    before: &Windows,
    after: &Windows,
) -> Vec<Notice> {
    let mut out = Vec::new();
    if notify_at.is_empty() {
        return out;
    }
    for p in policies {
        let Some((_, now)) = after.iter().find(|(n, _)| *n == p.name) else {
            continue;
        };
        let was = before
            .iter()
            .find(|(n, w)| *n == p.name && w.start_ms == now.start_ms)
            .map_or(0, |(_, w)| w.used);
        for &percent in notify_at {
            let at = units(p.limit, percent);
            if u64::from(was) < at && u64::from(now.used) >= at {
                out.push(Notice {
                    policy: p.name.clone(),
                    limit: p.limit,
                    used: now.used,
                    percent,
                    window_start: now.start_ms,
                    resets_at: now.start_ms.saturating_add(p.window_ms),
                });
            }
        }
    }
    out
}

/// Whether charging `cost` at `now_ms` may cross a threshold: asked before
/// the admission, on every request of a plan with `notify_at`, so the key's
/// object opens a transaction (the charge and a notice written together)
/// only for the few admissions of a window that may write one. Never `false`
/// when [`crossed`] could find one; `true` when unsure (a window from the
/// future, pinned to now).
pub fn may_cross(
    notify_at: &[u8],
    policies: &[Policy],
    windows: &Windows,
    now_ms: u64,
    cost: u32,
) -> bool {
    if cost == 0 {
        return false;
    }
    policies.iter().any(|p| {
        let stored = window_of(windows, &p.name).copied();
        let live = crate::rate_limit::in_force(stored, now_ms, p.window_ms);
        if live.is_some() && live != stored {
            return true;
        }
        let was = live.map_or(0, |w| u64::from(w.used));
        let now = was.saturating_add(u64::from(cost));
        notify_at.iter().any(|&percent| {
            let at = units(p.limit, percent);
            was < at && now >= at
        })
    })
}

/// The notice's event id: `evt_q` + hex of a hash of (key, policy, window,
/// threshold): the same notice is the same event, whoever publishes it.
pub fn event_id(key_id: &str, n: &Notice) -> String {
    let mut h = Sha256::new();
    for part in [
        key_id,
        &n.policy,
        &n.window_start.to_string(),
        &n.percent.to_string(),
    ] {
        h.update(part.as_bytes());
        h.update([0u8]);
    }
    let digest = h.finalize();
    let hex: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
    format!("evt_q{hex}")
}

/// The event's data: `{key_prefix, policy, limit, used, percent, resets_at}`
/// (`resets_at` in RFC 3339).
pub fn data(key_prefix: &str, n: &Notice) -> serde_json::Value {
    serde_json::json!({
        "key_prefix": key_prefix,
        "policy": n.policy,
        "limit": n.limit,
        "used": n.used,
        "percent": n.percent,
        "resets_at": crate::webhooks::events::rfc3339_ms(n.resets_at),
    })
}

/// Where a key's notices go: what the calling worker knows of the key and
/// the request, sent with each admission charged to the key's API policies
/// (`guard::AdmitRequest::notices`) so the object can write a notice it
/// decides in the same transaction, with no call of its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NoticeTo {
    pub key_id: String,
    pub key_prefix: String,
    pub project: String,
    /// The admission that crossed the threshold (the event's `request_id`).
    pub request_id: String,
}

/// The event to publish for `n`, as the key's object keeps it in its outbox
/// (published by its alarm through the one write path, as an event from a
/// response is).
pub fn pending(to: &NoticeTo, n: &Notice) -> PendingEvent {
    PendingEvent {
        id: event_id(&to.key_id, n),
        project: to.project.clone(),
        event_type: EVENT_TYPE.to_string(),
        data: data(&to.key_prefix, n),
        request_id: to.request_id.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rate_limit::Window;

    fn p(limit: u32) -> Vec<Policy> {
        vec![Policy {
            name: "minute".into(),
            limit,
            window_ms: 60_000,
        }]
    }

    fn w(start_ms: u64, used: u32) -> Windows {
        vec![("minute".to_string(), Window { start_ms, used })]
    }

    #[test]
    fn each_threshold_is_crossed_once_per_window() {
        let (pol, at) = (p(10), [50u8, 100]);
        assert!(crossed(&at, &pol, &w(0, 3), &w(0, 4)).is_empty());
        let half = crossed(&at, &pol, &w(0, 4), &w(0, 5));
        assert_eq!(half.len(), 1);
        assert_eq!(
            (half[0].percent, half[0].used, half[0].resets_at),
            (50, 5, 60_000)
        );
        assert!(crossed(&at, &pol, &w(0, 5), &w(0, 6)).is_empty(), "once");
        // A costly request crosses both at once.
        let both = crossed(&at, &pol, &w(0, 4), &w(0, 10));
        assert_eq!(
            both.iter().map(|n| n.percent).collect::<Vec<_>>(),
            [50, 100]
        );
        // A new window counts from zero.
        let next = crossed(&at, &pol, &w(0, 10), &w(60_000, 5));
        assert_eq!(next.len(), 1);
        assert_eq!(next[0].window_start, 60_000);
        assert!(crossed(&[], &pol, &w(0, 0), &w(0, 10)).is_empty());
    }

    proptest::proptest! {
        /// `may_cross` is never false when the admission crosses a threshold.
        #[test]
        fn may_cross_never_misses_a_crossing(
            limit in 1u32..50,
            used in 0u32..60,
            cost in 0u32..12,
            start in 0u64..200_000,
            now in 0u64..200_000,
            at in proptest::collection::vec(1u8..=100, 1..4),
        ) {
            let pol = p(limit);
            let before = w(start, used.min(limit));
            let checked = crate::limits::check_all(&before, &pol, now, cost);
            // A peek (cost 0) is never noticed: it charges nothing (`store::admit`).
            if let (Some(after), true) = (checked.windows, cost > 0) {
                if checked.verdicts.admitted() && !crossed(&at, &pol, &before, &after).is_empty() {
                    proptest::prop_assert!(may_cross(&at, &pol, &before, now, cost));
                }
            }
        }
    }

    #[test]
    fn may_cross_is_false_for_most_admissions() {
        let (pol, at) = (p(100), [50u8, 100]);
        assert!(!may_cross(&at, &pol, &w(0, 10), 1_000, 1));
        assert!(may_cross(&at, &pol, &w(0, 49), 1_000, 1));
        assert!(!may_cross(&at, &pol, &w(0, 50), 1_000, 1));
        assert!(may_cross(&at, &pol, &w(0, 99), 1_000, 1));
        assert!(!may_cross(&at, &pol, &w(0, 49), 1_000, 0), "a peek");
        // The window ended: the next one counts from 0.
        assert!(!may_cross(&at, &pol, &w(0, 49), 60_000, 1));
        assert!(may_cross(&at, &p(1), &w(0, 1), 60_000, 1));
        assert!(may_cross(&at, &pol, &Vec::new(), 0, 50));
    }

    #[test]
    fn a_notice_is_one_event_whoever_publishes_it() {
        let n = &crossed(&[80], &p(5), &w(0, 3), &w(0, 4))[0];
        assert_eq!(event_id("key_1", n), event_id("key_1", &n.clone()));
        assert_ne!(event_id("key_1", n), event_id("key_2", n));
        assert!(event_id("key_1", n).starts_with("evt_q"));
        let d = data("pgk_abc", n);
        assert_eq!(d["percent"], 80);
        assert_eq!(d["resets_at"], "1970-01-01T00:01:00.000Z");
    }
}
