//! Operating webhooks (docs/operating-webhooks.md, ADR 0014): a subscription's state and
//! health, the per-subscription throttle, and the bodies and queries of the
//! operation endpoints. Pure: the shell stores and applies what these return.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::delivery::Attempted;
use super::events::{self, NewSubscription};
use super::retry::AttemptResult;
use super::url_guard::{check_url, UrlPolicy};
use crate::audit::{parse_time, time_value};
use crate::Invalid;

/// The type of the operational event published when a subscription is disabled.
pub const DISABLED_EVENT: &str = "postguard.subscription.disabled";
/// The type of the test ping.
pub const PING_EVENT: &str = "postguard.ping";
/// `rate_limit_per_s` bounds.
pub const MAX_RATE_PER_S: u64 = 1_000;

/// A subscription's state, as stored and shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SubState {
    Active,
    Paused,
    Disabled,
}

impl SubState {
    pub fn as_str(self) -> &'static str {
        match self {
            SubState::Active => "active",
            SubState::Paused => "paused",
            SubState::Disabled => "disabled",
        }
    }

    /// Deliveries are held (`paused`) while the subscription is not active.
    pub fn holds(self) -> bool {
        self != SubState::Active
    }
}

/// Why a subscription was disabled (`disabled_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DisabledReason {
    /// The receiver answered 410 Gone.
    Gone,
    /// Every attempt failed for `webhooks.disable_after_s`.
    Failing,
}

impl DisabledReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DisabledReason::Gone => "endpoint_gone",
            DisabledReason::Failing => "failing",
        }
    }
}

/// What one attempt's result does to its subscription's failure clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// A success: the clock is reset.
    Healthy,
    /// Failing without a break since `since` (epoch ms), not long enough yet.
    Failing { since: u64 },
    /// Disable now; `since` is when the failures began.
    Disable { reason: DisabledReason, since: u64 },
}

/// The failure clock after `result` at `now`, given the current run of
/// failures began at `failing_since`. `None`: the attempt says nothing about
/// the receiver (it was not sent).
pub fn health(
    failing_since: Option<u64>,
    result: &Attempted,
    now: u64,
    disable_after_s: u32,
) -> Option<Health> {
    let Attempted::Sent(r) = result else {
        return None;
    };
    let since = failing_since.unwrap_or(now).min(now);
    Some(match r {
        AttemptResult::Status { code, .. } if (200..300).contains(code) => Health::Healthy,
        AttemptResult::Status { code: 410, .. } => Health::Disable {
            reason: DisabledReason::Gone,
            since,
        },
        _ if now - since >= u64::from(disable_after_s) * 1_000 => Health::Disable {
            reason: DisabledReason::Failing,
            since,
        },
        _ => Health::Failing { since },
    })
}

/// How late after its slot a throttled attempt may still be sent (ms). A
/// later one (its queue hop came back late) reserves a new slot instead, so
/// it cannot land beside the attempts of the slots after it.
pub const THROTTLE_LATE_MS: u64 = 50;
/// What `rate` consecutive slots span beyond one second (ms): more than
/// [`THROTTLE_LATE_MS`], so that `rate + 1` sends, each at most that late,
/// never fall within one second (§11: the bound holds over any one-second
/// span, not per clock second; issue 24).
pub const THROTTLE_MARGIN_MS: u64 = 2 * THROTTLE_LATE_MS;

/// The spacing of attempts under `rate_limit_per_s` (ms, at least 1):
/// `rate` intervals span a second and the margin.
pub fn interval_ms(rate_per_s: u32) -> u64 {
    (1_000 + THROTTLE_MARGIN_MS).div_ceil(u64::from(rate_per_s.max(1)))
}

/// Throttle slots reserved for `n` jobs of one subscription at `now`: the
/// first is the later of its next free slot and `now`, each next one
/// interval later; the subscription's next free slot follows the last. The
/// shell stores `next_free` only if the subscription's slot is still the one
/// it read (compare-and-set), so concurrent consumers never share a slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reserved {
    pub slots: Vec<u64>,
    pub next_free: u64,
}

pub fn reserve(next_free: Option<u64>, now: u64, rate_per_s: u32, n: usize) -> Reserved {
    let interval = interval_ms(rate_per_s);
    let first = next_free.unwrap_or(0).max(now);
    let slots: Vec<u64> = (0..n as u64)
        .map(|i| first.saturating_add(i.saturating_mul(interval)))
        .collect();
    let next_free = slots.last().map_or(first, |s| s.saturating_add(interval));
    Reserved { slots, next_free }
}

/// Whether a subscription's health changed: the write `health` asks for,
/// only when it differs from what the subscription records (a healthy
/// subscription that stays healthy, or a failing one that keeps failing,
/// costs no write).
pub fn health_change(
    failing_since: Option<u64>,
    result: &Attempted,
    now: u64,
    disable_after_s: u32,
) -> Option<Health> {
    match health(failing_since, result, now, disable_after_s)? {
        h @ Health::Healthy if failing_since.is_some() => Some(h),
        h @ Health::Failing { .. } if failing_since.is_none() => Some(h),
        h @ Health::Disable { .. } => Some(h),
        _ => None,
    }
}

/// How a throttled attempt waits for its reserved `slot` (epoch ms) at `now`:
/// whole seconds in the queue (a hop frees the consumer for everyone else),
/// the remaining fraction of a second in place, or, when it came back too
/// late for its slot, a new reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    Hop { delay_s: u64 },
    Sleep { ms: u64 },
    Stale,
}

pub fn throttle_wait(slot: u64, now: u64) -> Wait {
    if now > slot.saturating_add(THROTTLE_LATE_MS) {
        return Wait::Stale;
    }
    let ahead = slot.saturating_sub(now);
    if ahead >= 1_000 {
        Wait::Hop {
            delay_s: ahead / 1_000,
        }
    } else {
        Wait::Sleep { ms: ahead }
    }
}

/// `rate_limit_per_s`: absent, `null` (no limit) or 1..=1000.
fn rate(v: &Value) -> Result<Option<u32>, Invalid> {
    match v {
        Value::Null => Ok(None),
        Value::Number(n) => match n.as_u64() {
            Some(r @ 1..=MAX_RATE_PER_S) => Ok(u32::try_from(r).ok()),
            _ => Err(Invalid::field(
                "rate_limit_per_s",
                &format!("must be an integer from 1 to {MAX_RATE_PER_S}, or null"),
            )),
        },
        _ => Err(Invalid::field(
            "rate_limit_per_s",
            &format!("must be an integer from 1 to {MAX_RATE_PER_S}, or null"),
        )),
    }
}

/// A create body: the §7 fields, the optional `rate_limit_per_s`, and the
/// optional `secret` of a subscription moved from another system.
#[derive(Debug, Clone, PartialEq)]
pub struct Create {
    pub subscription: NewSubscription,
    pub rate_limit_per_s: Option<u32>,
    /// Given by the caller (`whsec_` + base64 of 24–64 bytes): deliveries
    /// are signed with it, so the receiver keeps verifying as before.
    pub secret: Option<String>,
}

pub fn parse_create(body: &[u8], policy: &UrlPolicy) -> Result<Create, Invalid> {
    let mut obj = object(body)?;
    let rate_limit_per_s = match obj.remove("rate_limit_per_s") {
        Some(v) => rate(&v)?,
        None => None,
    };
    let secret = match obj.remove("secret") {
        Some(Value::String(s)) if crate::webhooks::signature::is_importable_secret(&s) => Some(s),
        Some(_) => {
            return Err(Invalid::field(
                "secret",
                "must be whsec_ followed by the standard base64 of 24 to 64 bytes",
            ))
        }
        None => None,
    };
    let rest = serde_json::to_vec(&obj).map_err(|e| Invalid(format!("body: {e}")))?;
    Ok(Create {
        subscription: events::parse_subscription(&rest, policy)?,
        rate_limit_per_s,
        secret,
    })
}

/// A `PATCH` body: each field present is changed.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Patch {
    pub url: Option<String>,
    pub events: Option<Vec<String>>,
    /// `Some(None)`: clear it.
    pub description: Option<Option<String>>,
    pub rate_limit_per_s: Option<Option<u32>>,
}

fn object(body: &[u8]) -> Result<serde_json::Map<String, Value>, Invalid> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err("body: must be a JSON object".into()),
        Err(e) => Err(format!("body: must be a valid JSON object ({e})").into()),
    }
}

/// Parses a `PATCH /webhooks/{id}` body against the subscription as it is
/// (`url`, `events`): the same rules as create, on the merged result.
pub fn parse_patch(
    body: &[u8],
    current_url: &str,
    current_events: &[String],
    policy: &UrlPolicy,
) -> Result<Patch, Invalid> {
    let obj = object(body)?;
    let mut patch = Patch::default();
    let mut merged = serde_json::json!({"url": current_url, "events": current_events});
    for (k, v) in &obj {
        match k.as_str() {
            "url" | "events" => merged[k] = v.clone(),
            "description" if v.is_null() => patch.description = Some(None),
            "description" => merged[k] = v.clone(),
            "rate_limit_per_s" => patch.rate_limit_per_s = Some(rate(v)?),
            other => {
                let name: String = other.chars().take(64).collect();
                return Err(format!("{name}: unknown field").into());
            }
        }
    }
    let bytes = serde_json::to_vec(&merged).map_err(|e| Invalid(format!("body: {e}")))?;
    let s = events::parse_subscription(&bytes, policy)?;
    if obj.contains_key("url") {
        patch.url = Some(s.url);
    }
    if obj.contains_key("events") {
        patch.events = Some(s.events);
    }
    if obj.get("description").is_some_and(|v| !v.is_null()) {
        patch.description = Some(s.description);
    }
    Ok(patch)
}

/// `POST /webhooks/{id}/recover` body: `{since, until?}` (RFC 3339 or epoch ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recover {
    pub since: u64,
    pub until: Option<u64>,
}

/// The latest time a recover range takes (9999-12-31, epoch ms): stored
/// exactly in D1's doubles.
pub const MAX_TIME_MS: u64 = 253_402_300_799_999;

pub fn parse_recover(body: &[u8]) -> Result<Recover, Invalid> {
    let obj = object(body)?;
    let time = |k: &str| -> Result<Option<u64>, Invalid> {
        obj.get(k).map(|v| time_value(k, v)).transpose()
    };
    if let Some(k) = obj
        .keys()
        .find(|k| !matches!(k.as_str(), "since" | "until"))
    {
        let name: String = k.chars().take(64).collect();
        return Err(format!("{name}: unknown field").into());
    }
    let since = time("since")?.ok_or_else(|| Invalid::field("since", "is required"))?;
    let until = time("until")?;
    for (k, v) in [("since", Some(since)), ("until", until)] {
        if v.is_some_and(|t| t > MAX_TIME_MS) {
            return Err(Invalid::field(k, "must not be after 9999-12-31"));
        }
    }
    if until.is_some_and(|u| u < since) {
        return Err(Invalid::field("until", "must not be before since"));
    }
    Ok(Recover { since, until })
}

/// A background task's state (`GET /tasks/{id}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    Queued,
    Running,
    Done,
    Failed,
}

impl TaskState {
    /// As stored and shown (`state` of a task).
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Queued => "queued",
            TaskState::Running => "running",
            TaskState::Done => "done",
            TaskState::Failed => "failed",
        }
    }
}

/// How many deliveries one recover step re-queues (one queue `sendBatch`).
pub const RECOVER_CHUNK: u32 = 100;

/// Order of the event feed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    Asc,
    Desc,
}

/// `GET /_postguard/v1/events` parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeedQuery {
    pub since: Option<u64>,
    pub until: Option<u64>,
    pub event_type: Option<String>,
    pub order: Order,
    pub limit: u32,
    pub cursor: Option<(u64, String)>,
}

pub fn parse_feed(pairs: &[(String, String)]) -> Result<FeedQuery, Invalid> {
    let mut q = FeedQuery {
        since: None,
        until: None,
        event_type: None,
        order: Order::Desc,
        limit: crate::page::parse_limit(None)?,
        cursor: None,
    };
    for (k, v) in pairs {
        match k.as_str() {
            "since" => q.since = Some(parse_time("since", v)?),
            "until" => q.until = Some(parse_time("until", v)?),
            "type" if !v.is_empty() && v.len() <= events::MAX_TYPE_LEN => {
                q.event_type = Some(v.clone())
            }
            "type" => return Err(Invalid::field("type", "must be 1-128 characters")),
            "order" => {
                q.order = match v.as_str() {
                    "asc" => Order::Asc,
                    "desc" => Order::Desc,
                    _ => return Err(Invalid::field("order", "must be asc or desc")),
                }
            }
            "limit" => q.limit = crate::page::parse_limit(Some(v))?,
            "cursor" => q.cursor = Some(crate::page::decode_cursor(v)?),
            other => {
                let name: String = other.chars().take(64).collect();
                return Err(format!("{name}: unknown parameter").into());
            }
        }
    }
    Ok(q)
}

/// How long an inspector captures (24 h), and how many requests it keeps.
pub const INSPECTOR_TTL_MS: u64 = 86_400_000;
pub const INSPECTOR_MAX_REQUESTS: u32 = 100;
/// The most of a captured body that is kept.
pub const INSPECTOR_MAX_BODY: usize = 65_536;

/// Whether `url` is a capture URL of this gateway: `public_origin` is the
/// configured `public_url` — never the origin a request claims in its
/// `Host` — and an unset one (`""`) names no inspector.
pub fn is_inspector_url(url: &str, public_origin: &str) -> bool {
    !public_origin.is_empty()
        && url
            .strip_prefix(public_origin)
            .and_then(|rest| rest.strip_prefix("/_postguard/inspect/"))
            .is_some_and(|token| {
                !token.is_empty() && token.bytes().all(|b| b.is_ascii_alphanumeric())
            })
}

/// The URL rules as every send applies them — a subscription's URL, a
/// redirect, a test ping — both when the URL is given and again right
/// before each request goes out (the configuration may have changed since):
/// the URL rules accept `url`, or it is a capture URL of this gateway.
pub fn check_target_url(
    url: &str,
    public_origin: &str,
    policy: &UrlPolicy,
) -> Result<String, Invalid> {
    if is_inspector_url(url, public_origin) {
        return Ok(url.to_string());
    }
    check_url(url, policy)
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: u64 = 1_700_000_000_000;

    fn sent(code: u16) -> Attempted {
        Attempted::Sent(AttemptResult::Status {
            code,
            retry_after: None,
        })
    }

    #[test]
    fn the_failure_clock() {
        assert_eq!(
            health(Some(T), &sent(200), T + 5, 10),
            Some(Health::Healthy)
        );
        assert_eq!(
            health(None, &sent(500), T, 10),
            Some(Health::Failing { since: T })
        );
        assert_eq!(
            health(Some(T), &sent(500), T + 9_999, 10),
            Some(Health::Failing { since: T })
        );
        assert_eq!(
            health(
                Some(T),
                &Attempted::Sent(AttemptResult::Timeout),
                T + 10_000,
                10
            ),
            Some(Health::Disable {
                reason: DisabledReason::Failing,
                since: T
            })
        );
        assert_eq!(
            health(None, &sent(410), T, 432_000),
            Some(Health::Disable {
                reason: DisabledReason::Gone,
                since: T
            })
        );
        let gave_up = Attempted::GaveUp(super::super::delivery::GiveUp::GatewayFailure);
        assert_eq!(health(Some(T), &gave_up, T + 1, 1), None);
    }

    #[test]
    fn reservations_follow_the_next_free_slot_or_now() {
        let r = reserve(None, T, 5, 3);
        assert_eq!(
            r,
            Reserved {
                slots: vec![T, T + 220, T + 440],
                next_free: T + 660
            }
        );
        let r = reserve(Some(T + 1_000), T, 5, 1);
        assert_eq!(
            r,
            Reserved {
                slots: vec![T + 1_000],
                next_free: T + 1_220
            }
        );
        assert_eq!(
            reserve(Some(T - 5_000), T, 5, 0).next_free,
            T,
            "nothing reserved"
        );
    }

    #[test]
    fn only_a_change_of_health_is_written() {
        let answered = |code| {
            Attempted::Sent(AttemptResult::Status {
                code,
                retry_after: None,
            })
        };
        let (ok, failed) = (answered(200), answered(500));
        assert_eq!(
            health_change(None, &ok, T, 60),
            None,
            "healthy stays healthy"
        );
        assert_eq!(
            health_change(Some(T - 1), &ok, T, 60),
            Some(Health::Healthy)
        );
        assert_eq!(
            health_change(None, &failed, T, 60),
            Some(Health::Failing { since: T })
        );
        assert_eq!(
            health_change(Some(T - 1), &failed, T, 60),
            None,
            "failing keeps failing"
        );
    }

    #[test]
    fn throttle_spacing_and_waits() {
        assert_eq!(interval_ms(5), 220);
        assert_eq!(interval_ms(3), 367);
        assert_eq!(interval_ms(0), 1_100);
        assert_eq!(throttle_wait(T, T + 5), Wait::Sleep { ms: 0 });
        assert_eq!(throttle_wait(T, T + THROTTLE_LATE_MS + 1), Wait::Stale);
        assert_eq!(throttle_wait(T + 999, T), Wait::Sleep { ms: 999 });
        assert_eq!(throttle_wait(T + 2_500, T), Wait::Hop { delay_s: 2 });
    }

    proptest::proptest! {
        /// Slots reserved one interval apart, each sent at most
        /// `THROTTLE_LATE_MS` after its slot (a later one re-reserves):
        /// no one-second span holds more than `rate` sends.
        #[test]
        fn no_second_holds_more_than_the_rate(
            rate in 1u32..50,
            late in proptest::collection::vec(0u64..=THROTTLE_LATE_MS, 1..200),
            gaps in proptest::collection::vec(0u64..3_000, 1..200),
        ) {
            // Reserved one or a few at a time, as batches do, through the
            // function the shell calls.
            let (mut next, mut sends) = (Some(T), Vec::new());
            for (i, chunk) in late.chunks(3).enumerate() {
                let now = T + gaps.iter().take(i + 1).sum::<u64>() / 4;
                let r = reserve(next, now, rate, chunk.len());
                next = Some(r.next_free);
                sends.extend(r.slots.iter().zip(chunk).map(|(slot, l)| slot + l));
            }
            sends.sort_unstable();
            let r = rate as usize;
            for w in sends.windows(r + 1) {
                proptest::prop_assert!(w[r] - w[0] > 1_000, "{} sends within {} ms", r + 1, w[r] - w[0]);
            }
        }
    }

    fn policy() -> UrlPolicy<'static> {
        UrlPolicy {
            allow_insecure: false,
            allow_hosts: &[],
        }
    }

    #[test]
    fn patches_merge_and_validate() {
        let ev = vec!["*".to_string()];
        let p = parse_patch(
            br#"{"events":["a.b"]}"#,
            "https://x.example/h",
            &ev,
            &policy(),
        )
        .unwrap();
        assert_eq!(p.events, Some(vec!["a.b".to_string()]));
        assert_eq!(p.url, None);
        let p = parse_patch(
            br#"{"description":null,"rate_limit_per_s":5}"#,
            "https://x.example/h",
            &ev,
            &policy(),
        )
        .unwrap();
        assert_eq!(p.description, Some(None));
        assert_eq!(p.rate_limit_per_s, Some(Some(5)));
        for bad in [
            &br#"{"url":"http://127.0.0.1/"}"#[..],
            br#"{"events":[]}"#,
            br#"{"secret":"x"}"#,
            br#"{"rate_limit_per_s":0}"#,
            br#"{"rate_limit_per_s":1.5}"#,
            br#"[]"#,
        ] {
            assert!(
                parse_patch(bad, "https://x.example/h", &ev, &policy()).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn create_takes_a_rate_limit() {
        let c = parse_create(
            br#"{"url":"https://x.example/h","events":["*"],"rate_limit_per_s":5}"#,
            &policy(),
        )
        .unwrap();
        assert_eq!(
            (c.subscription.url.as_str(), c.rate_limit_per_s, c.secret),
            ("https://x.example/h", Some(5), None)
        );
        assert!(parse_create(
            br#"{"url":"https://x.example/h","events":["*"],"rate_limit_per_s":"5"}"#,
            &policy()
        )
        .is_err());
    }

    #[test]
    fn create_keeps_a_secret_moved_from_another_system() {
        let with = |secret: &str| {
            let body =
                format!(r#"{{"url":"https://x.example/h","events":["*"],"secret":"{secret}"}}"#);
            parse_create(body.as_bytes(), &policy())
        };
        let ok = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        assert_eq!(with(ok).unwrap().secret.as_deref(), Some(ok));
        let b64 = |n: usize| {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.encode(vec![7u8; n])
        };
        assert!(with(&format!("whsec_{}", b64(64))).is_ok());
        for bad in [
            format!("whsec_{}", b64(23)),
            format!("whsec_{}", b64(65)),
            b64(32),
            "whsec_not base64!".to_string(),
        ] {
            let e = with(&bad).unwrap_err();
            assert!(e.0.starts_with("secret:") && !e.0.contains(&bad), "{}", e.0);
        }
    }

    #[test]
    fn recover_bodies() {
        assert_eq!(
            parse_recover(br#"{"since":5}"#).unwrap(),
            Recover {
                since: 5,
                until: None
            }
        );
        assert!(parse_recover(br#"{}"#).is_err());
        assert!(parse_recover(br#"{"since":9,"until":5}"#).is_err());
        assert!(parse_recover(br#"{"since":"yesterday"}"#).is_err());
        assert!(parse_recover(br#"{"since":1,"x":1}"#).is_err());
        assert!(parse_recover(br#"{"since":1,"until":null}"#).is_err());
        assert!(parse_recover(br#"{"since":6979880761862539000}"#).is_err());
    }

    #[test]
    fn feed_queries() {
        let q = |s: &[(&str, &str)]| {
            parse_feed(
                &s.iter()
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .collect::<Vec<_>>(),
            )
        };
        assert_eq!(q(&[]).unwrap().order, Order::Desc);
        assert_eq!(q(&[("order", "asc")]).unwrap().order, Order::Asc);
        assert!(q(&[("order", "up")]).is_err());
        assert!(q(&[("cursor", "zz")]).is_err());
        assert!(q(&[("nope", "1")]).is_err());
        assert!(q(&[("limit", "0")]).is_err());
    }

    #[test]
    fn inspector_urls() {
        let o = "https://gw.example";
        assert!(is_inspector_url(
            "https://gw.example/_postguard/inspect/abc123",
            o
        ));
        assert!(!is_inspector_url(
            "https://gw.example/_postguard/inspect/",
            o
        ));
        assert!(!is_inspector_url(
            "https://gw.example/_postguard/inspect/a/b",
            o
        ));
        assert!(!is_inspector_url(
            "https://evil.example/_postguard/inspect/abc",
            o
        ));
        assert!(check_target_url("http://127.0.0.1/x", o, &policy()).is_err());
        // Without a configured public URL nothing is an inspector, whatever
        // origin a request claimed.
        assert!(!is_inspector_url("/_postguard/inspect/abc123", ""));
        assert!(check_target_url(
            "http://localhost:8788/_postguard/inspect/abc",
            "",
            &policy()
        )
        .is_err());
    }
}
