//! `GET /usage` (docs/live-api.md): per key and hour or day, the requests
//! that retries cannot double-count. What counts is decided per request
//! ([`billable`], [`counts_of`]); the shards keep the hourly sums
//! (`Rollups::usage`) and [`merge`] adds them up per period.

use serde::{Deserialize, Serialize};

use super::tally::Tally;
use super::{DAY_MS, HOUR_MS};
use crate::audit::{parse_time, AuditRow};
use crate::page::{decode_cursor, encode_cursor, parse_limit, Page};
use crate::Invalid;

/// Whether a request is billable: each operation once. A request with an
/// Idempotency-Key is billable on the execution whose final answer was
/// stored (never its replays, its 409s, nor a run that ended in a 5xx or a
/// timeout, which stores nothing); one without a key when it was forwarded
/// and answered below 500.
pub fn billable(claimed: bool, answer_stored: bool, forwarded: bool, status: u16) -> bool {
    match claimed {
        true => answer_stored,
        false => forwarded && status < 500,
    }
}

/// A row's usage counts: a proxied request of a key (the gateway's own
/// calls are not the API's usage; a request without a key has no one to
/// bill).
pub fn counts_of(r: &AuditRow, hour: u64) -> Option<UsageDelta> {
    let key_prefix = r.key_prefix.clone()?;
    if crate::routes::is_gateway_path(&r.path) {
        return None;
    }
    let c = &r.counted;
    Some(UsageDelta {
        hour,
        project: r.project.clone().unwrap_or_default(),
        key_prefix,
        requests: 1,
        admitted: u64::from(c.forwarded && !r.replayed),
        billable: u64::from(c.billable && !r.replayed),
        replays: u64::from(r.replayed),
        refused: u64::from(r.status == 429),
        missing_key: u64::from(c.missing_key),
    })
}

/// One key's proxied requests in one hour, as `/usage` counts them
/// (`usage::counts_of`). `project` names the key's project, so the
/// cross-project shard of a bucket can attribute them too.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageDelta {
    pub hour: u64,
    pub project: String,
    pub key_prefix: String,
    pub requests: u64,
    pub admitted: u64,
    pub billable: u64,
    pub replays: u64,
    pub refused: u64,
    pub missing_key: u64,
}

impl UsageDelta {
    pub(super) fn counts(&self) -> [u64; 6] {
        [
            self.requests,
            self.admitted,
            self.billable,
            self.replays,
            self.refused,
            self.missing_key,
        ]
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Granularity {
    Hour,
    Day,
}

impl Granularity {
    fn ms(self) -> u64 {
        match self {
            Granularity::Hour => HOUR_MS,
            Granularity::Day => DAY_MS,
        }
    }
}

/// What a shard is asked: its usage sums with `since_ms <= hour < until_ms`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageQuery {
    pub since_ms: u64,
    pub until_ms: u64,
    /// Only this project's keys (the cross-project shard holds them all).
    pub project: Option<String>,
}

/// `GET /usage`'s parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Params {
    pub since_ms: u64,
    pub until_ms: u64,
    pub granularity: Granularity,
    pub project: Option<String>,
    pub limit: u32,
    /// After this entry (`period_start`, `project` NUL `key_prefix`).
    pub after: Option<(u64, String)>,
}

/// How far back `/usage` reads without `since`: 7 days.
pub const DEFAULT_SPAN_MS: u64 = 7 * DAY_MS;

/// Parses the query at `now_ms`: `since` and `until` (epoch ms or RFC 3339;
/// default the last 7 days, `since` rounded down to its period),
/// `granularity` (`hour` or `day`, default `day`), `project` (the
/// operator's only).
pub fn parse<'a, I>(pairs: I, allow_project: bool, now_ms: u64) -> Result<Params, Invalid>
where
    I: IntoIterator<Item = (&'a str, &'a str)>,
{
    let (mut since, mut until, mut granularity, mut project) = (None, None, Granularity::Day, None);
    let (mut limit, mut after) = (parse_limit(None)?, None);
    for (k, v) in pairs {
        match k {
            "since" => since = Some(parse_time(k, v)?),
            "until" => until = Some(parse_time(k, v)?),
            "granularity" => {
                granularity = match v {
                    "hour" => Granularity::Hour,
                    "day" => Granularity::Day,
                    _ => return Err(Invalid::field(k, "must be hour or day")),
                }
            }
            "project" if allow_project => {
                if !crate::ids::is_valid_name(v) {
                    return Err(Invalid::field(
                        k,
                        "must be 1-64 characters of [A-Za-z0-9._-]",
                    ));
                }
                project = Some(v.to_string());
            }
            "limit" => limit = parse_limit(Some(v))?,
            "cursor" => after = Some(decode_cursor(v)?),
            other => return Err(Invalid::unknown_parameter(other)),
        }
    }
    let until_ms = until.unwrap_or(now_ms);
    let since_ms = since.unwrap_or(until_ms.saturating_sub(DEFAULT_SPAN_MS));
    if since_ms > until_ms {
        return Err(Invalid::field("since", "must not be after until"));
    }
    let p = granularity.ms();
    Ok(Params {
        since_ms: since_ms / p * p,
        until_ms,
        granularity,
        project,
        limit,
        after,
    })
}

/// The order of entries and of a cursor: period, then project and key.
fn position(u: &Usage) -> (u64, String) {
    (
        u.period_start,
        format!("{}\u{0}{}", u.project, u.key_prefix),
    )
}

/// One page of the merged entries (in [`merge`]'s order), after `after`.
pub fn page(entries: Vec<Usage>, after: Option<&(u64, String)>, limit: u32) -> Page<Usage> {
    let rows: Vec<Usage> = entries
        .into_iter()
        .filter(|u| after.is_none_or(|a| position(u) > *a))
        .take(limit as usize + 1)
        .collect();
    Page::of(rows, limit, |u| {
        let (t, id) = position(u);
        encode_cursor(t, &id)
    })
}

/// One period of one key (`GET /usage`'s `data`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub key_prefix: String,
    pub project: String,
    /// The period's first millisecond (UTC; epoch ms).
    pub period_start: u64,
    pub requests: u64,
    pub admitted: u64,
    pub billable: u64,
    pub replays: u64,
    pub refused: u64,
}

/// The shards' hourly sums added up per period and key, oldest period
/// first, then by project and key.
pub fn merge(parts: Vec<Vec<UsageDelta>>, g: Granularity) -> Vec<Usage> {
    let p = g.ms();
    let mut t = Tally::default();
    for d in parts.into_iter().flatten() {
        let counts = [d.requests, d.admitted, d.billable, d.replays, d.refused];
        t.add((d.hour / p * p, d.project, d.key_prefix, 0), &counts);
    }
    t.0.into_iter()
        .map(|((period_start, project, key_prefix, _), c)| Usage {
            key_prefix,
            project,
            period_start,
            requests: c[0],
            admitted: c[1],
            billable: c[2],
            replays: c[3],
            refused: c[4],
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::Counted;

    #[test]
    fn each_operation_is_billable_once() {
        // With a key: only the execution whose answer was stored.
        assert!(billable(true, true, true, 201));
        assert!(!billable(true, false, true, 503), "a 5xx is not stored");
        assert!(
            !billable(true, false, false, 409),
            "in progress: not forwarded"
        );
        assert!(!billable(true, false, false, 422));
        // Without: forwarded and below 500.
        assert!(billable(false, false, true, 404));
        assert!(!billable(false, false, true, 502));
        assert!(!billable(false, false, false, 429));
    }

    fn row(path: &str, status: u16, counted: Counted, replayed: bool) -> AuditRow {
        AuditRow {
            request_id: "req_1".into(),
            time: 0,
            method: "POST".into(),
            path: path.into(),
            status,
            response_bytes: None,
            response_time_ms: 1,
            client_ip: None,
            user_agent: None,
            key_prefix: Some("pgk_abc".into()),
            project: Some("acme".into()),
            idempotency_key: None,
            replayed,
            rate_limit_remaining: None,
            origin: None,
            would_refuse: None,
            counted,
        }
    }

    #[test]
    fn a_retried_request_counts_once_and_its_replays_apart() {
        let stored = Counted {
            forwarded: true,
            billable: true,
            missing_key: false,
        };
        let failed = Counted {
            forwarded: true,
            ..Counted::default()
        };
        // A 503, its retry that succeeds, a 409 while it ran, two replays, a 429.
        let rows = [
            row("/orders", 503, failed, false),
            row("/orders", 201, stored, false),
            row("/orders", 409, Counted::default(), false),
            row("/orders", 201, stored, true),
            row("/orders", 201, stored, true),
            row("/orders", 429, Counted::default(), false),
            row("/_postguard/v1/me", 200, Counted::default(), false),
        ];
        let deltas: Vec<UsageDelta> = rows
            .iter()
            .filter_map(|r| counts_of(r, 7 * HOUR_MS))
            .collect();
        let merged = merge(vec![deltas], Granularity::Day);
        assert_eq!(
            merged,
            [Usage {
                key_prefix: "pgk_abc".into(),
                project: "acme".into(),
                period_start: 0,
                requests: 6,
                admitted: 2,
                billable: 1,
                replays: 2,
                refused: 1,
            }]
        );
    }

    #[test]
    fn queries_default_to_seven_days_by_day() {
        let now = 100 * DAY_MS + 5;
        let p = parse([], false, now).unwrap();
        assert_eq!(
            (p.since_ms, p.until_ms, p.granularity),
            (93 * DAY_MS, now, Granularity::Day)
        );
        let p = parse([("granularity", "hour"), ("since", "3600001")], false, now).unwrap();
        assert_eq!((p.since_ms, p.granularity), (HOUR_MS, Granularity::Hour));
        assert!(parse([("granularity", "week")], false, now)
            .unwrap_err()
            .0
            .starts_with("granularity"));
        assert!(
            parse([("project", "acme")], false, now).is_err(),
            "a key reads its own project"
        );
        assert_eq!(
            parse([("project", "acme")], true, now)
                .unwrap()
                .project
                .as_deref(),
            Some("acme")
        );
        assert!(parse([("since", "10"), ("until", "5")], false, now).is_err());
        assert!(parse([("cursor", "nonsense")], false, now).is_err());
    }

    #[test]
    fn pages_follow_the_cursor_to_the_end() {
        let entry = |t: u64, project: &str, key: &str| Usage {
            key_prefix: key.into(),
            project: project.into(),
            period_start: t,
            requests: 1,
            admitted: 1,
            billable: 1,
            replays: 0,
            refused: 0,
        };
        let all = vec![
            entry(0, "a", "k1"),
            entry(0, "a", "k2"),
            entry(0, "b", "k1"),
            entry(HOUR_MS, "a", "k1"),
        ];
        let first = page(all.clone(), None, 3);
        assert_eq!(first.data, all[..3]);
        let after = decode_cursor(first.next_cursor.as_deref().unwrap_or("")).unwrap();
        let second = page(all.clone(), Some(&after), 3);
        assert_eq!((second.data, second.next_cursor), (all[3..].to_vec(), None));
    }
}
