//! How many webhook records one D1 database holds, and the decisions that
//! keep it within that bound (issue 16, ADR 0017).
//!
//! Three limits, each decided here and enforced by the shell
//! (`src/webhooks/usage.rs`):
//! - [`admit`]: a project's events, deliveries and bytes charged per UTC day
//!   ([`event_bytes`]), read from its `webhook_usage` counter row (one point
//!   read, never a scan);
//! - [`storage`]: D1's own size (`meta.size_after` of the last statement the
//!   isolate ran) against `webhooks.d1_high_water_bytes`;
//! - [`manual_refused`]: manual retries and redirects per delivery.
//!
//! [`footprint`] is the arithmetic that ties them together: what projects at
//! their full quota keep for `retention.deliveries_days` against the mark,
//! with the bytes per row measured by `bench/webhook-records.py` (SQLite,
//! VACUUMed, indexes included). [`sweep_again`] paces the retention job.

use crate::config::Settings;
use crate::problem::{ErrorCode, Problem};

pub const DAY_MS: u64 = 86_400_000;

/// The UTC day of `now_ms`: days since the Unix epoch (the counter key).
pub fn utc_day(now_ms: u64) -> u64 {
    now_ms / DAY_MS
}

/// Whole seconds until the next UTC day begins (≥ 1): when a quota resets.
pub fn until_next_day_s(now_ms: u64) -> u64 {
    let next = (utc_day(now_ms) + 1) * DAY_MS;
    (next - now_ms).div_ceil(1000).max(1)
}

/// The daily retention job's time of day (UTC minutes): wrangler.toml's
/// `17 3 * * *` trigger. The size guard's Retry-After points at it, since
/// the sweep is what frees space.
pub const DAILY_SWEEP_UTC_MIN: u64 = 3 * 60 + 17;

/// Whole seconds until the next daily sweep (≥ 1).
pub fn until_next_sweep_s(now_ms: u64) -> u64 {
    let sweep_in_day = DAILY_SWEEP_UTC_MIN * 60_000;
    let today = utc_day(now_ms) * DAY_MS + sweep_in_day;
    let next = if today > now_ms {
        today
    } else {
        today + DAY_MS
    };
    (next - now_ms).div_ceil(1000).max(1)
}

/// A project's counter row for one UTC day (`webhook_usage`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Usage {
    pub events: u64,
    pub deliveries: u64,
    /// Bytes charged ([`event_bytes`], [`MANUAL_ATTEMPT_BYTES`]).
    pub bytes: u64,
}

/// What a request is about to store, for [`admit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storing {
    /// A published event: every quota applies.
    Event,
    /// An inspector or a capture: only the bytes quota.
    Bytes,
}

impl Usage {
    /// This usage with one more event of `deliveries` deliveries and a
    /// payload of `payload_len` bytes counted: what a group commit adds for
    /// each event it admits, so the next event of the same project in the
    /// same group is admitted against it (ADR 0024), as the `count`
    /// statement will charge it.
    pub fn with_event(self, deliveries: u64, payload_len: u64, s: &Settings) -> Usage {
        Usage {
            events: self.events + 1,
            deliveries: self.deliveries + deliveries,
            bytes: self.bytes + event_bytes(payload_len, 0, s) + deliveries * delivery_bytes(s),
        }
    }
}

/// Whether `project` may store one more `what` today, given its `usage` so
/// far. The quotas are checked before the write, so one event may overshoot
/// them by at most its own fan-out and bytes; concurrent publishes may each
/// pass on the same count (bounded by the concurrency, see ADR 0017).
pub fn admit(
    project: &str,
    usage: Usage,
    what: Storing,
    s: &Settings,
    now_ms: u64,
) -> Result<(), Problem> {
    let wh = &s.webhooks;
    let mut limits = vec![("bytes", usage.bytes, wh.bytes_per_project_per_day)];
    if what == Storing::Event {
        limits.push((
            "events",
            usage.events,
            u64::from(wh.events_per_project_per_day),
        ));
        limits.push((
            "deliveries",
            usage.deliveries,
            u64::from(wh.deliveries_per_project_per_day),
        ));
    }
    let over = limits.into_iter().find(|(_, n, quota)| n >= quota);
    match over {
        None => Ok(()),
        Some((what, n, quota)) => {
            let shown: String = project.chars().take(64).collect();
            Err(Problem::new(
                ErrorCode::EventQuotaExceeded,
                format!("project {shown} reached its daily quota of {quota} {what} ({n} today, UTC); it resets at 00:00 UTC"),
            )
            .with_retry_after(until_next_day_s(now_ms)))
        }
    }
}

/// The global guard: D1's size as last seen (`meta.size_after` of the
/// latest statement this isolate ran, bytes) against the high-water mark. At
/// or above it publishing is refused with 503 `STORAGE_FULL` and a
/// Retry-After at the next retention sweep, which is what frees space; the
/// very next publish sees the size again, so it resumes as soon as there is
/// room. No size seen yet: admitted (the write itself reports it).
pub fn storage(size_after: Option<u64>, high_water: u64, now_ms: u64) -> Result<(), Problem> {
    match size_after {
        Some(bytes) if bytes >= high_water => Err(Problem::new(
            ErrorCode::StorageFull,
            format!("the gateway's webhook storage is full ({bytes} of {high_water} bytes); no event is accepted until retention frees space"),
        )
        .with_retry_after(until_next_sweep_s(now_ms))),
        _ => Ok(()),
    }
}

/// Whether the first time a storage refusal is seen by this isolate should
/// be logged: once per transition from admitting to refusing.
pub fn log_transition(was_full: bool, is_full: bool) -> bool {
    is_full && !was_full
}

/// 409 `RETRY_LIMIT_REACHED`: the delivery had its
/// `webhooks.manual_attempts_per_delivery` manual attempts (retries and
/// redirects) on top of its automatic schedule. The count is a
/// compare-and-increment in D1 (`manual_attempts`), so racing requests
/// cannot pass it together.
pub fn manual_refused(s: &Settings) -> Problem {
    let max = s.webhooks.manual_attempts_per_delivery;
    Problem::new(
        ErrorCode::RetryLimitReached,
        format!("this delivery already had its {max} manual attempts (retries and redirects); publish the event again under a new id to send it once more"),
    )
}

/// Deliveries (with their attempts, outbox rows and manual counts) and
/// events deleted per retention round: one D1 batch each, small enough to
/// stay well inside a statement's time limit.
pub const SWEEP_CHUNK: u64 = 1_000;
/// Rounds per daily sweep: up to 1,000,000 deliveries a day, more than
/// `projects` at full default quota create (8 × 50,000).
pub const SWEEP_MAX_ROUNDS: u32 = 1_000;

/// Whether the retention sweep goes on after a round that deleted
/// `deleted` rows: a full chunk means more may be left.
pub fn sweep_again(deleted: u64, round: u32) -> bool {
    deleted >= SWEEP_CHUNK && round + 1 < SWEEP_MAX_ROUNDS
}

/// Bytes per row, measured with the real schema and indexes by
/// `bench/webhook-records.py` (SQLite 3.40, VACUUMed; see ADR 0017).
pub mod measured {
    /// An `events` row with its indexes, beyond the payload's own bytes
    /// (1 KB payload: 1,503 B per row; 64 KiB payload: 66,181 B).
    pub const EVENT_OVERHEAD: u64 = 650;
    pub const EVENT_REQUEST: u64 = 137;
    pub const DELIVERY: u64 = 510;
    pub const OUTBOX: u64 = 217;
    /// An attempt with a short response excerpt (`{"ok":true}`).
    pub const ATTEMPT_TYPICAL: u64 = 227;
    /// An attempt with an error and a full 512-character excerpt.
    pub const ATTEMPT_MAX: u64 = 755;
    /// What an attempt keeps of its headers at most (from 0.4): a bound,
    /// [`crate::webhooks::trace::KEPT_BYTES_MAX`], not a measurement.
    pub const ATTEMPT_HEADERS: u64 = crate::webhooks::trace::KEPT_BYTES_MAX;
    /// An inspector (223 B measured).
    pub const INSPECTOR: u64 = 250;
    /// A capture beyond its headers (as JSON) and kept body (117 B measured).
    pub const CAPTURE_OVERHEAD: u64 = 150;
}

/// What creating an inspector is charged.
pub const INSPECTOR_BYTES: u64 = measured::INSPECTOR;

/// What one inspector capture is charged: its headers and body as stored.
/// (Only the newest captures are kept, so this over-counts, never under.)
pub fn capture_bytes(headers_len: u64, body_len: u64) -> u64 {
    measured::CAPTURE_OVERHEAD + headers_len + body_len
}

/// The bytes one published event may come to in D1, charged to its
/// project's day when it is stored: the event row (its payload as stored)
/// and its trace row, and per delivery its row, its outbox row and every
/// automatic attempt at the largest attempt row. Manual attempts are
/// charged when they are queued ([`MANUAL_ATTEMPT_BYTES`]).
pub fn event_bytes(payload_len: u64, deliveries: u64, s: &Settings) -> u64 {
    use measured::*;
    payload_len + EVENT_OVERHEAD + EVENT_REQUEST + deliveries * delivery_bytes(s)
}

/// What one delivery is charged: its row, its outbox row and every automatic
/// attempt at the largest attempt row.
pub fn delivery_bytes(s: &Settings) -> u64 {
    use measured::*;
    let automatic = s.webhooks.schedule_s.len() as u64 + 1;
    DELIVERY + OUTBOX + automatic * (ATTEMPT_MAX + ATTEMPT_HEADERS)
}

/// What one manual attempt (retry or redirect) is charged.
pub const MANUAL_ATTEMPT_BYTES: u64 = measured::ATTEMPT_MAX + measured::ATTEMPT_HEADERS;

/// What a project at its full daily quota keeps (ADR 0035): one shard per
/// project and bucket (a UTC day by default) holds at most a bucket's worth
/// of its charged bytes, so the bound is per shard and no figure depends on
/// how many projects share the deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footprint {
    /// Bytes charged for one event with a 1 KB payload and one delivery.
    pub typical_event_bytes: u64,
    /// Bytes charged for one event with the largest payload and one delivery.
    pub largest_event_bytes: u64,
    /// What one shard can be charged: a bucket's days (at least one) of the
    /// daily bytes quota.
    pub bytes_per_shard: u64,
    /// What one project keeps over the retention (its shards together).
    pub bytes_per_project: u64,
    /// Whether a shard at full quota stays under `shard_high_water_bytes`.
    pub shard_fits: bool,
}

/// The capacity arithmetic: a shard is charged at most its bucket's days ×
/// the daily bytes quota, which must stay under the shard's mark. Every
/// event is charged at least what it stores, so this holds whatever the
/// payloads and failures are.
pub fn footprint(s: &Settings) -> Footprint {
    let wh = &s.webhooks;
    let days = wh.shard_bucket_ms.div_ceil(DAY_MS).max(1);
    let bytes_per_shard = wh.bytes_per_project_per_day.saturating_mul(days);
    Footprint {
        typical_event_bytes: event_bytes(1_024, 1, s),
        largest_event_bytes: event_bytes(u64::from(wh.max_payload_bytes), 1, s),
        bytes_per_shard,
        bytes_per_project: wh
            .bytes_per_project_per_day
            .saturating_mul(u64::from(s.retention.deliveries_days)),
        shard_fits: bytes_per_shard <= wh.shard_high_water_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOON: u64 = 20_788 * DAY_MS + 12 * 3_600_000;

    fn settings() -> Settings {
        Settings::default()
    }

    #[test]
    fn a_group_admits_each_event_against_the_ones_before_it() {
        let mut s = settings();
        s.webhooks.events_per_project_per_day = 2;
        let first = Usage::default();
        assert!(admit("p", first, Storing::Event, &s, NOON).is_ok());
        let second = first.with_event(3, 100, &s);
        assert_eq!(second.events, 1);
        assert_eq!(second.deliveries, 3);
        assert_eq!(
            second.bytes,
            event_bytes(100, 0, &s) + 3 * delivery_bytes(&s)
        );
        assert!(admit("p", second, Storing::Event, &s, NOON).is_ok());
        let third = second.with_event(3, 100, &s);
        assert!(admit("p", third, Storing::Event, &s, NOON).is_err());
    }

    #[test]
    fn days_and_resets_are_utc() {
        assert_eq!(utc_day(0), 0);
        assert_eq!(utc_day(DAY_MS - 1), 0);
        assert_eq!(utc_day(DAY_MS), 1);
        assert_eq!(until_next_day_s(NOON), 12 * 3_600);
        assert_eq!(until_next_day_s(DAY_MS - 1), 1);
        assert_eq!(until_next_day_s(DAY_MS), 86_400);
    }

    #[test]
    fn the_next_sweep_is_today_or_tomorrow_at_0317() {
        let day = 20_788 * DAY_MS;
        assert_eq!(until_next_sweep_s(day), DAILY_SWEEP_UTC_MIN * 60);
        assert_eq!(
            until_next_sweep_s(NOON),
            (24 * 60 - 12 * 60 + DAILY_SWEEP_UTC_MIN) * 60
        );
        let at = day + DAILY_SWEEP_UTC_MIN * 60_000;
        assert_eq!(until_next_sweep_s(at), 86_400);
    }

    /// The Retry-After of a full database points at wrangler.toml's daily trigger.
    #[test]
    fn the_sweep_time_is_wranglers_daily_trigger() {
        let toml = include_str!("../../../../wrangler.toml");
        let (h, m) = (DAILY_SWEEP_UTC_MIN / 60, DAILY_SWEEP_UTC_MIN % 60);
        assert!(
            toml.contains(&format!("\"{m} {h} * * *\"")),
            "wrangler.toml has no \"{m} {h} * * *\" trigger"
        );
    }

    #[test]
    fn quota_admits_below_and_refuses_at_it_with_retry_after() {
        let mut s = settings();
        s.webhooks.events_per_project_per_day = 3;
        s.webhooks.deliveries_per_project_per_day = 10;
        s.webhooks.bytes_per_project_per_day = 1_000;
        let u = |events, deliveries| Usage {
            events,
            deliveries,
            bytes: 0,
        };
        assert!(admit("p", u(0, 0), Storing::Event, &s, NOON).is_ok());
        assert!(admit("p", u(2, 9), Storing::Event, &s, NOON).is_ok());
        let full = Usage {
            bytes: 1_000,
            ..u(0, 0)
        };
        assert!(admit("p", full, Storing::Event, &s, NOON)
            .unwrap_err()
            .detail
            .contains("1000 bytes"));
        let e = admit("p", u(3, 0), Storing::Event, &s, NOON).unwrap_err();
        assert_eq!(e.code, ErrorCode::EventQuotaExceeded);
        assert_eq!(e.status(), 429);
        assert_eq!(e.retry_after_s, Some(12 * 3_600));
        assert!(e.detail.contains("3 events"), "{}", e.detail);
        assert!(
            admit("p", u(3, 10), Storing::Bytes, &s, NOON).is_ok(),
            "an inspector is held to the bytes quota only"
        );
        assert!(admit("p", full, Storing::Bytes, &s, NOON).is_err());
        let e = admit("p", u(1, 10), Storing::Event, &s, NOON).unwrap_err();
        assert!(e.detail.contains("10 deliveries"), "{}", e.detail);
    }

    #[test]
    fn storage_guard_refuses_at_the_mark_until_the_next_sweep() {
        assert!(storage(None, 1_000, NOON).is_ok());
        assert!(storage(Some(999), 1_000, NOON).is_ok());
        let p = storage(Some(1_000), 1_000, NOON).unwrap_err();
        assert_eq!((p.code, p.status()), (ErrorCode::StorageFull, 503));
        assert_eq!(p.retry_after_s, Some(until_next_sweep_s(NOON)));
        assert!(log_transition(false, true));
        assert!(!log_transition(true, true));
        assert!(!log_transition(false, false));
    }

    #[test]
    fn the_sweep_goes_on_while_rounds_are_full_and_stops_at_its_bound() {
        assert!(sweep_again(SWEEP_CHUNK, 0));
        assert!(!sweep_again(SWEEP_CHUNK - 1, 0));
        assert!(!sweep_again(0, 0));
        assert!(!sweep_again(SWEEP_CHUNK, SWEEP_MAX_ROUNDS - 1));
        assert!(u64::from(SWEEP_MAX_ROUNDS) * SWEEP_CHUNK >= 8 * 50_000);
    }

    #[test]
    fn manual_refusal_names_the_bound() {
        let mut s = settings();
        s.webhooks.manual_attempts_per_delivery = 2;
        let e = manual_refused(&s);
        assert_eq!((e.code, e.status()), (ErrorCode::RetryLimitReached, 409));
        assert!(e.detail.contains("its 2 manual attempts"), "{}", e.detail);
    }

    /// The capacity table of docs/capacity.md, from the shipped defaults.
    #[test]
    fn shipped_defaults_fit_the_high_water_mark() {
        let s = settings();
        // Each attempt at the largest row and the most its kept headers take (360 B).
        assert_eq!(measured::ATTEMPT_HEADERS, 360);
        assert_eq!(
            event_bytes(1_024, 1, &s),
            1_024 + 787 + 727 + 5 * (755 + 360)
        );
        assert_eq!(event_bytes(0, 0, &s), 787);
        let f = footprint(&s);
        assert_eq!(f.typical_event_bytes, 8_113);
        assert_eq!(f.largest_event_bytes, 65_536 + 787 + 6_302);
        assert_eq!(f.bytes_per_shard, 8 << 30);
        assert_eq!(f.bytes_per_project, 14 * (8 << 30));
        assert!(f.shard_fits);
        // Issue 24: at least 1,000,000 events of 1 KB per project per UTC day.
        assert!(s.webhooks.events_per_project_per_day >= 1_000_000);
        // The events quota is reachable within the bytes quota with 1 KB events.
        assert!(
            u64::from(s.webhooks.events_per_project_per_day) * f.typical_event_bytes
                <= s.webhooks.bytes_per_project_per_day
        );
    }

    proptest::proptest! {
        /// Whatever the settings, the footprint of `projects` projects never
        /// exceeds the mark (the proof docs/capacity.md states).
        #[test]
        fn footprint_never_exceeds_the_mark(
            bytes in 1u64..10_000_000_000, bucket in 1_000u64..(31 * DAY_MS), hw in 1u64..10_000_000_000,
        ) {
            let mut s = settings();
            s.webhooks.bytes_per_project_per_day = bytes;
            s.webhooks.shard_high_water_bytes = hw;
            s.webhooks.shard_bucket_ms = bucket;
            let f = footprint(&s);
            // A shard holds events of at most ceil(bucket / day) UTC days.
            proptest::prop_assert!(f.bytes_per_shard >= bytes);
            proptest::prop_assert_eq!(f.shard_fits, f.bytes_per_shard <= hw);
        }

        /// An event is charged at least the rows it stores at their largest.
        #[test]
        fn an_event_is_charged_at_least_its_rows(payload in 0u64..(1 << 20), n in 0u64..5_000) {
            use measured::*;
            let s = settings();
            let rows = payload + EVENT_OVERHEAD + EVENT_REQUEST + n * (DELIVERY + OUTBOX + 5 * ATTEMPT_MAX);
            proptest::prop_assert!(event_bytes(payload, n, &s) >= rows);
        }

        #[test]
        fn reset_is_within_one_day(now in 0u64..10_000_000_000_000) {
            let s = until_next_day_s(now);
            proptest::prop_assert!((1..=86_400).contains(&s));
            proptest::prop_assert_eq!(utc_day(now + s * 1000), utc_day(now) + 1);
        }
    }
}
