//! What each request and each delivery attempt writes to Workers Analytics
//! Engine (docs/observability.md, binding `METRICS`): the columns of one data point,
//! decided here from facts the shell gathered; the shell only writes it.
//!
//! Columns are positional in Analytics Engine (`blob1`…, `double1`…), so
//! their order is part of the published interface: append, never reorder.
//! `index1` is the project (the sampling key: a busy project is sampled
//! without thinning a quiet one).

/// One data point, ready for `writeDataPoint`.
#[derive(Debug, Clone, PartialEq)]
pub struct DataPoint {
    pub index: String,
    pub blobs: Vec<String>,
    pub doubles: Vec<f64>,
}

/// Longest blob written (Analytics Engine allows 16 KiB over all blobs).
const MAX_BLOB: usize = 256;

/// Where a request went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Forwarded (or meant to be) to the origin.
    Proxied,
    /// One of the gateway's own `/_postguard/` endpoints.
    Gateway,
}

/// What the shell knows about a request once it is answered.
#[derive(Debug, Clone, Copy)]
pub struct RequestFacts<'a> {
    pub kind: Kind,
    /// The gateway route's template, or for a proxied request the method's
    /// configured route pattern that matched (`*` when none did).
    pub route: &'a str,
    pub method: &'a str,
    pub status: u16,
    /// The problem's code when postguard answered with an error itself.
    pub code: Option<&'a str>,
    /// On a quota 429: the policy that refused.
    pub policy: Option<&'a str>,
    pub replayed: bool,
    pub project: Option<&'a str>,
    pub key_prefix: Option<&'a str>,
    pub latency_ms: u64,
    /// How long the origin took, when the request reached it.
    pub origin_ms: Option<u64>,
    /// Report-only limits: the policy that would have refused it.
    pub would_refuse: Option<&'a str>,
    /// The origin a proxied request was routed to.
    pub origin: Option<&'a str>,
}

/// The request's outcome, one word an operator groups by: `admitted` (the
/// origin's answer, any status below 500), `replay`, `limited` (a quota
/// 429; `blob4` names the policy), `would_limit` (forwarded by report-only
/// limits that would have refused it; `blob4` names the policy), `concurrency`, `in_progress` (409),
/// `conflict` (422), `unauthenticated` (401), `client_error` (other 4xx
/// of postguard's), `origin_5xx`, `timeout`, `unreachable`, `error` (the
/// gateway's own 5xx).
pub fn outcome(f: &RequestFacts<'_>) -> &'static str {
    match f.code {
        Some("RATE_LIMIT_EXCEEDED") => "limited",
        Some("CONCURRENCY_LIMIT_EXCEEDED") => "concurrency",
        Some("IDEMPOTENCY_KEY_IN_PROGRESS") => "in_progress",
        Some("IDEMPOTENCY_KEY_REUSE_CONFLICT") => "conflict",
        Some("ORIGIN_TIMEOUT") => "timeout",
        Some("ORIGIN_UNREACHABLE") => "unreachable",
        Some(_) if f.status == 401 => "unauthenticated",
        Some(_) if f.status >= 500 => "error",
        Some(_) => "client_error",
        None if f.replayed => "replay",
        None if f.status >= 500 => "origin_5xx",
        None if f.would_refuse.is_some() => "would_limit",
        None => "admitted",
    }
}

/// The request's data point.
///
/// | column | value |
/// |---|---|
/// | `index1` | project (`-` without one) |
/// | `blob1` | `request` |
/// | `blob2` | `proxied` or `gateway` |
/// | `blob3` | outcome ([`outcome`]) |
/// | `blob4` | the refusing policy on a quota 429 (or the one that would have refused, `would_limit`), else empty |
/// | `blob5` | project |
/// | `blob6` | key prefix |
/// | `blob7` | route |
/// | `blob8` | method |
/// | `blob9` | error code, else empty |
/// | `blob10` | the origin a proxied request was routed to, else empty |
/// | `double1` | status |
/// | `double2` | latency, ms |
/// | `double3` | origin latency, ms (0 when not forwarded) |
/// | `double4` | 1 when the origin was reached |
pub fn request_point(f: &RequestFacts<'_>) -> DataPoint {
    let project = f.project.unwrap_or("");
    DataPoint {
        index: index(project),
        blobs: [
            "request",
            match f.kind {
                Kind::Proxied => "proxied",
                Kind::Gateway => "gateway",
            },
            outcome(f),
            f.policy.or(f.would_refuse).unwrap_or(""),
            project,
            f.key_prefix.unwrap_or(""),
            f.route,
            f.method,
            f.code.unwrap_or(""),
            f.origin.unwrap_or(""),
        ]
        .into_iter()
        .map(blob)
        .collect(),
        doubles: vec![
            f64::from(f.status),
            f.latency_ms as f64,
            f.origin_ms.unwrap_or(0) as f64,
            if f.origin_ms.is_some() { 1.0 } else { 0.0 },
        ],
    }
}

/// What the consumer knows about one delivery attempt.
#[derive(Debug, Clone, Copy)]
pub struct AttemptFacts<'a> {
    pub project: &'a str,
    pub subscription: &'a str,
    pub event_type: &'a str,
    /// [`attempt_outcome`]: `delivered`, `failed` or `dead`.
    pub outcome: &'a str,
    /// The receiver's status (0: none, e.g. a timeout or refused connection).
    pub status: u16,
    pub attempt: u32,
    pub latency_ms: u64,
    /// From when the attempt was due to when it was sent.
    pub lag_ms: u64,
}

/// An attempt's outcome: `delivered` (2xx), `dead` (given up, or the last
/// attempt of the schedule failed: dead-lettered), else `failed` (a retry
/// follows, or a manual attempt that changed nothing).
pub fn attempt_outcome(status: Option<u16>, gave_up: bool, dead_lettered: bool) -> &'static str {
    match (status, gave_up || dead_lettered) {
        (Some(200..=299), _) => "delivered",
        (_, true) => "dead",
        _ => "failed",
    }
}

/// When an attempt was due: the job's planned time, or for a first attempt
/// the delivery's creation; the lag is from then to `sent_at`.
pub fn attempt_lag_ms(planned: Option<u64>, created_at: u64, sent_at: u64) -> u64 {
    sent_at.saturating_sub(planned.unwrap_or(created_at))
}

/// A delivery attempt's data point.
///
/// | column | value |
/// |---|---|
/// | `index1` | project |
/// | `blob1` | `delivery` |
/// | `blob2` | outcome: `delivered`, `failed` or `dead` |
/// | `blob3` | project |
/// | `blob4` | subscription id |
/// | `blob5` | event type |
/// | `double1` | the receiver's status (0: no answer) |
/// | `double2` | latency, ms |
/// | `double3` | attempt number (1 = the first) |
/// | `double4` | lag from due to sent, ms |
pub fn attempt_point(f: &AttemptFacts<'_>) -> DataPoint {
    DataPoint {
        index: index(f.project),
        blobs: [
            "delivery",
            f.outcome,
            f.project,
            f.subscription,
            f.event_type,
        ]
        .into_iter()
        .map(blob)
        .collect(),
        doubles: vec![
            f64::from(f.status),
            f.latency_ms as f64,
            f64::from(f.attempt),
            f.lag_ms as f64,
        ],
    }
}

fn index(project: &str) -> String {
    match project.is_empty() {
        true => "-".to_string(),
        // Analytics Engine indexes are at most 96 bytes; project names are
        // at most 64 ASCII characters.
        false => blob(project),
    }
}

fn blob(s: &str) -> String {
    let mut end = s.len().min(MAX_BLOB);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts<'a>() -> RequestFacts<'a> {
        RequestFacts {
            kind: Kind::Proxied,
            route: "*",
            method: "POST",
            status: 201,
            code: None,
            policy: None,
            replayed: false,
            project: Some("acme"),
            key_prefix: Some("pgk_AbCdEfGh"),
            latency_ms: 12,
            origin_ms: Some(9),
            would_refuse: None,
            origin: Some("default"),
        }
    }

    #[test]
    fn outcomes_name_what_happened() {
        let f = facts();
        let with = |code, status| RequestFacts {
            code: Some(code),
            status,
            origin_ms: None,
            ..f
        };
        assert_eq!(outcome(&f), "admitted");
        assert_eq!(
            outcome(&RequestFacts {
                replayed: true,
                ..f
            }),
            "replay"
        );
        assert_eq!(outcome(&RequestFacts { status: 503, ..f }), "origin_5xx");
        let reported = RequestFacts {
            would_refuse: Some("minute"),
            ..f
        };
        assert_eq!(outcome(&reported), "would_limit");
        assert_eq!(request_point(&reported).blobs[3], "minute");
        for (code, status, want) in [
            ("RATE_LIMIT_EXCEEDED", 429, "limited"),
            ("CONCURRENCY_LIMIT_EXCEEDED", 429, "concurrency"),
            ("IDEMPOTENCY_KEY_IN_PROGRESS", 409, "in_progress"),
            ("IDEMPOTENCY_KEY_REUSE_CONFLICT", 422, "conflict"),
            ("ORIGIN_TIMEOUT", 504, "timeout"),
            ("ORIGIN_UNREACHABLE", 502, "unreachable"),
            ("INVALID_API_KEY", 401, "unauthenticated"),
            ("API_KEY_EXPIRED", 401, "unauthenticated"),
            ("VALIDATION_ERROR", 400, "client_error"),
            ("INTERNAL_ERROR", 500, "error"),
        ] {
            assert_eq!(outcome(&with(code, status)), want, "{code}");
        }
    }

    #[test]
    fn a_request_point_has_its_columns_in_the_published_order() {
        let f = RequestFacts {
            status: 429,
            code: Some("RATE_LIMIT_EXCEEDED"),
            policy: Some("minute"),
            origin_ms: None,
            ..facts()
        };
        let p = request_point(&f);
        assert_eq!(p.index, "acme");
        assert_eq!(
            p.blobs,
            [
                "request",
                "proxied",
                "limited",
                "minute",
                "acme",
                "pgk_AbCdEfGh",
                "*",
                "POST",
                "RATE_LIMIT_EXCEEDED",
                "default"
            ]
        );
        assert_eq!(p.doubles, [429.0, 12.0, 0.0, 0.0]);
        let admitted = request_point(&facts());
        assert_eq!(admitted.doubles, [201.0, 12.0, 9.0, 1.0]);
        let anonymous = request_point(&RequestFacts {
            project: None,
            key_prefix: None,
            ..facts()
        });
        assert_eq!(
            (anonymous.index.as_str(), anonymous.blobs[4].as_str()),
            ("-", "")
        );
    }

    #[test]
    fn an_attempt_point_has_its_columns_in_the_published_order() {
        let p = attempt_point(&AttemptFacts {
            project: "acme",
            subscription: "sub_1",
            event_type: "order.paid",
            outcome: "failed",
            status: 503,
            attempt: 2,
            latency_ms: 40,
            lag_ms: 1_500,
        });
        assert_eq!(
            p.blobs,
            ["delivery", "failed", "acme", "sub_1", "order.paid"]
        );
        assert_eq!(p.doubles, [503.0, 40.0, 2.0, 1_500.0]);
    }

    #[test]
    fn attempt_outcomes_and_lag() {
        assert_eq!(attempt_outcome(Some(204), false, false), "delivered");
        assert_eq!(attempt_outcome(Some(503), false, false), "failed");
        assert_eq!(attempt_outcome(None, false, false), "failed");
        assert_eq!(attempt_outcome(Some(410), false, true), "dead");
        assert_eq!(attempt_outcome(None, true, false), "dead");
        assert_eq!(attempt_lag_ms(Some(1_000), 10, 1_250), 250);
        assert_eq!(attempt_lag_ms(None, 10, 1_250), 1_240);
        assert_eq!(attempt_lag_ms(Some(2_000), 10, 1_250), 0, "early is no lag");
    }

    #[test]
    fn blobs_are_bounded_on_a_character_boundary() {
        let long = "é".repeat(300);
        let b = blob(&long);
        assert!(b.len() <= MAX_BLOB && b.chars().all(|c| c == 'é'));
    }
}
