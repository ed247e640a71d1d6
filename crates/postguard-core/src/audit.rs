//! The audit log: the row recorded per request, and the query language of
//! `GET /_postguard/v1/audit` and `/stats` translated into SQL for D1.
//!
//! Rows hold no bodies, query strings, secrets or full keys: only the fields
//! below. Lists are newest first, keyed by `(time, request_id)`; the cursor is
//! that pair, opaque to clients.

use crate::page::parse_limit;
use crate::Invalid;
use serde::{Deserialize, Serialize};
// Re-exported while the delivery log still imports them from here.
pub use crate::page::{decode_cursor, encode_cursor};

/// One request as recorded (CONTRACT §6).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRow {
    pub request_id: String,
    pub time: u64,
    pub method: String,
    pub path: String,
    pub status: u16,
    pub response_bytes: Option<u64>,
    pub response_time_ms: u64,
    pub client_ip: Option<String>,
    pub user_agent: Option<String>,
    pub key_prefix: Option<String>,
    pub project: Option<String>,
    pub idempotency_key: Option<String>,
    pub replayed: bool,
    pub rate_limit_remaining: Option<u32>,
}

pub const MAX_PATH_LEN: usize = 1024;
/// D1 refuses LIKE patterns longer than 50 bytes ("LIKE or GLOB pattern too
/// complex"): a longer wildcard filter is the client's error, not a 500.
pub const MAX_LIKE_PATTERN_BYTES: usize = 50;
pub const MAX_USER_AGENT_LEN: usize = 512;

/// Truncates to at most `n` characters (stored strings are bounded).
pub fn bounded(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

/// A value bound to a `?` placeholder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arg {
    Text(String),
    Int(i64),
}

/// `status=` filter: an exact code or a class (`4xx`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusFilter {
    Exact(u16),
    Class(u16),
}

/// A parsed, validated `GET /audit` query.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditQuery {
    pub request_id: Option<String>,
    pub method: Option<String>,
    pub status: Option<StatusFilter>,
    pub path: Option<String>,
    pub idempotency_key: Option<String>,
    pub key_prefix: Option<String>,
    pub project: Option<String>,
    pub since: Option<u64>,
    pub until: Option<u64>,
    pub limit: u32,
    pub cursor: Option<(u64, String)>,
}

fn bad(field: &str, why: &str) -> Invalid {
    Invalid::field(field, why)
}

/// Epoch milliseconds or RFC 3339.
pub fn parse_time(field: &str, v: &str) -> Result<u64, Invalid> {
    if let Ok(ms) = v.parse::<u64>() {
        return Ok(ms);
    }
    chrono::DateTime::parse_from_rfc3339(v)
        .ok()
        .and_then(|t| u64::try_from(t.timestamp_millis()).ok())
        .ok_or_else(|| bad(field, "must be epoch milliseconds or an RFC 3339 timestamp"))
}

fn parse_status(v: &str) -> Result<StatusFilter, Invalid> {
    let b = v.as_bytes();
    if b.len() == 3 && (b'1'..=b'5').contains(&b[0]) && v[1..].eq_ignore_ascii_case("xx") {
        return Ok(StatusFilter::Class(u16::from(b[0] - b'0')));
    }
    match v.parse::<u16>() {
        Ok(s) if (100..=599).contains(&s) => Ok(StatusFilter::Exact(s)),
        _ => Err(bad(
            "status",
            "must be a status code (404) or a class (2xx, 4xx, 5xx)",
        )),
    }
}

fn text(field: &str, v: &str, max: usize) -> Result<String, Invalid> {
    if v.is_empty() || v.chars().count() > max || v.chars().any(char::is_control) {
        return Err(bad(
            field,
            &format!("must be 1-{max} characters without control characters"),
        ));
    }
    Ok(v.to_string())
}

impl AuditQuery {
    /// Parses query pairs. `project` is honoured only for the operator
    /// (`allow_project`); unknown parameters are refused so typos do not
    /// silently widen a search.
    pub fn parse<'a, I>(pairs: I, allow_project: bool) -> Result<AuditQuery, Invalid>
    where
        I: IntoIterator<Item = (&'a str, &'a str)>,
    {
        let mut q = AuditQuery {
            limit: 50,
            ..AuditQuery::default()
        };
        for (k, v) in pairs {
            match k {
                "request_id" => q.request_id = Some(text(k, v, 64)?),
                "method" => {
                    let m = v.to_ascii_uppercase();
                    if m.is_empty() || m.len() > 16 || !m.bytes().all(|b| b.is_ascii_uppercase()) {
                        return Err(bad(k, "must be an HTTP method"));
                    }
                    q.method = Some(m);
                }
                "status" => q.status = Some(parse_status(v)?),
                "path" => {
                    if !v.starts_with('/') {
                        return Err(bad(k, "must start with / (use * as a wildcard)"));
                    }
                    let p = text(k, v, MAX_PATH_LEN)?;
                    if p.contains('*') && like_pattern(&p).len() > MAX_LIKE_PATTERN_BYTES {
                        return Err(bad(
                            k,
                            "a pattern with * may be at most 50 bytes once %, _ and \\ are escaped",
                        ));
                    }
                    q.path = Some(p);
                }
                "idempotency_key" => q.idempotency_key = Some(text(k, v, 255)?),
                "key_prefix" => q.key_prefix = Some(text(k, v, 12)?),
                "project" if allow_project => {
                    if !crate::config::is_valid_name(v) {
                        return Err(bad(k, "must be 1-64 characters of [A-Za-z0-9._-]"));
                    }
                    q.project = Some(v.to_string());
                }
                "since" => q.since = Some(parse_time(k, v)?),
                "until" => q.until = Some(parse_time(k, v)?),
                "limit" => q.limit = parse_limit(Some(v))?,
                "cursor" => q.cursor = Some(decode_cursor(v)?),
                other => return Err(bad(&bounded(other, 64), "unknown parameter")),
            }
        }
        Ok(q)
    }

    /// The SQL (for D1) and its arguments. Fetches `limit + 1` rows so the
    /// caller knows whether a next page exists.
    pub fn to_sql(&self) -> (String, Vec<Arg>) {
        let mut wh: Vec<&str> = Vec::new();
        let mut args = Vec::new();
        let mut eq = |col: &'static str, v: &Option<String>, wh: &mut Vec<&str>| {
            if let Some(v) = v {
                wh.push(col);
                args.push(Arg::Text(v.clone()));
            }
        };
        eq("request_id = ?", &self.request_id, &mut wh);
        eq("method = ?", &self.method, &mut wh);
        eq("idempotency_key = ?", &self.idempotency_key, &mut wh);
        eq("key_prefix = ?", &self.key_prefix, &mut wh);
        eq("project = ?", &self.project, &mut wh);
        // Without `*` the match is exact (and not bound by LIKE's pattern limit).
        match &self.path {
            Some(p) if p.contains('*') => {
                wh.push("path LIKE ? ESCAPE '\\'");
                args.push(Arg::Text(like_pattern(p)));
            }
            Some(p) => {
                wh.push("path = ?");
                args.push(Arg::Text(p.clone()));
            }
            None => {}
        }
        match self.status {
            Some(StatusFilter::Exact(s)) => {
                wh.push("status = ?");
                args.push(Arg::Int(i64::from(s)));
            }
            Some(StatusFilter::Class(c)) => {
                wh.push("status >= ? AND status < ?");
                args.push(Arg::Int(i64::from(c) * 100));
                args.push(Arg::Int(i64::from(c) * 100 + 100));
            }
            None => {}
        }
        if let Some(s) = self.since {
            wh.push("time >= ?");
            args.push(Arg::Int(ms(s)));
        }
        if let Some(u) = self.until {
            wh.push("time <= ?");
            args.push(Arg::Int(ms(u)));
        }
        if let Some((t, id)) = &self.cursor {
            wh.push("(time < ? OR (time = ? AND request_id < ?))");
            args.push(Arg::Int(ms(*t)));
            args.push(Arg::Int(ms(*t)));
            args.push(Arg::Text(id.clone()));
        }
        let mut sql = format!("SELECT {COLUMNS} FROM audit_log");
        if !wh.is_empty() {
            sql.push_str(" WHERE ");
            sql.push_str(&wh.join(" AND "));
        }
        sql.push_str(" ORDER BY time DESC, request_id DESC LIMIT ?");
        args.push(Arg::Int(i64::from(self.limit) + 1));
        (sql, args)
    }
}

fn ms(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Every column, in `AuditRow` order.
pub const COLUMNS: &str =
    "request_id, time, method, path, status, response_bytes, response_time_ms, \
client_ip, user_agent, key_prefix, project, idempotency_key, replayed, rate_limit_remaining";

/// `*` (one or more characters) → `_%`; `%`, `_` and `\` are literal.
pub fn like_pattern(p: &str) -> String {
    let mut out = String::with_capacity(p.len() + 4);
    for c in p.chars() {
        match c {
            '*' => out.push_str("_%"),
            '%' | '_' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out
}

/// `?days=` of `/stats`: 1..=90, default 30.
pub fn parse_days(raw: Option<&str>) -> Result<u32, Invalid> {
    match raw {
        None => Ok(30),
        Some(v) => match v.parse::<u32>() {
            Ok(d) if (1..=90).contains(&d) => Ok(d),
            _ => Err(bad("days", "must be an integer between 1 and 90")),
        },
    }
}

/// The oldest `time` kept by retention.
/// The per-isolate audit writer's bounds (the shell's `src/audit.rs` holds
/// the queue; these decide). Rows one isolate holds at most.
pub const MAX_PENDING: usize = 1_000;
/// Batches one flusher writes at most before giving way.
pub const MAX_ROUNDS: usize = 10;
/// A flusher older than this is presumed dropped by the runtime (beyond
/// `waitUntil`'s 30 s): the next row starts a new one.
pub const FLUSHER_STALE_MS: u64 = 35_000;

/// Whether a row may join a queue of `pending` rows (else it is dropped and
/// counted).
pub fn may_queue(pending: usize) -> bool {
    pending < MAX_PENDING
}

/// Whether a new flusher must start: none runs (`since_ms` = 0), or the one
/// that does started so long ago that the runtime must have dropped it.
pub fn must_start_flusher(since_ms: u64, now_ms: u64) -> bool {
    since_ms == 0 || now_ms.saturating_sub(since_ms) >= FLUSHER_STALE_MS
}

pub fn retention_cutoff_ms(now_ms: u64, days: u32) -> u64 {
    now_ms.saturating_sub(u64::from(days) * 86_400_000)
}

/// Row offset of the `q`-quantile (nearest rank) among `n` sorted values.
pub fn quantile_offset(n: u64, q: f64) -> u64 {
    if n == 0 {
        return 0;
    }
    let rank = (q * n as f64).ceil() as u64;
    rank.clamp(1, n) - 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &[(&str, &str)], admin: bool) -> Result<AuditQuery, Invalid> {
        AuditQuery::parse(s.iter().copied(), admin)
    }

    #[test]
    fn filters_parse_and_validate() {
        let q = parse(
            &[
                ("status", "4xx"),
                ("method", "post"),
                ("path", "/v1/*"),
                ("since", "2026-01-01T00:00:00Z"),
                ("limit", "10"),
            ],
            false,
        )
        .unwrap();
        assert_eq!(q.status, Some(StatusFilter::Class(4)));
        assert_eq!(q.method.as_deref(), Some("POST"));
        assert_eq!(q.since, Some(1_767_225_600_000));
        assert_eq!(q.limit, 10);
        assert_eq!(
            parse(&[("status", "201")], false).unwrap().status,
            Some(StatusFilter::Exact(201))
        );
        assert_eq!(
            parse(&[("until", "1700000000000")], false).unwrap().until,
            Some(1_700_000_000_000)
        );
        for bad in [
            ("status", "6xx"),
            ("status", "99"),
            ("status", "abc"),
            ("since", "yesterday"),
            ("limit", "0"),
            ("limit", "201"),
            ("path", "no-slash"),
            ("cursor", "!!"),
            ("method", "P0ST"),
            ("bogus", "1"),
            ("request_id", ""),
            ("key_prefix", "pgk_0123456789"),
        ] {
            assert!(parse(&[bad], true).is_err(), "{bad:?}");
        }
        // `project` is the operator's filter only.
        assert!(parse(&[("project", "acme")], false).is_err());
        assert_eq!(
            parse(&[("project", "acme")], true)
                .unwrap()
                .project
                .as_deref(),
            Some("acme")
        );
    }

    #[test]
    fn sql_binds_every_value_and_pages_by_time_then_id() {
        let mut q = parse(
            &[
                ("status", "5xx"),
                ("path", "/a_b/*"),
                ("idempotency_key", "k'; DROP"),
            ],
            true,
        )
        .unwrap();
        q.cursor = Some((10, "req_b".into()));
        q.project = Some("acme".into());
        let (sql, args) = q.to_sql();
        assert!(
            !sql.contains("DROP") && !sql.contains("acme"),
            "values are bound, never inlined: {sql}"
        );
        assert!(sql.ends_with("ORDER BY time DESC, request_id DESC LIMIT ?"));
        assert_eq!(sql.matches('?').count(), args.len());
        assert!(args.contains(&Arg::Text("/a\\_b/_%".into())));
        assert!(args.contains(&Arg::Int(500)) && args.contains(&Arg::Int(600)));
        assert_eq!(args.last(), Some(&Arg::Int(51)));
    }

    #[test]
    fn exact_paths_skip_like_and_long_patterns_are_refused() {
        let long = format!("/{}", "a_b/".repeat(40));
        let (sql, args) = parse(&[("path", &long)], false).unwrap().to_sql();
        assert!(sql.contains("path = ?") && !sql.contains("LIKE"), "{sql}");
        assert!(args.contains(&Arg::Text(long.clone())));
        // 50 bytes once escaped is the most D1 takes.
        let at_limit = format!("/{}*", "a".repeat(47));
        assert_eq!(like_pattern(&at_limit).len(), 50);
        assert!(parse(&[("path", &at_limit)], false).is_ok());
        let over = format!("/{}*", "a".repeat(48));
        assert_eq!(like_pattern(&over).len(), 51);
        assert!(parse(&[("path", &over)], false)
            .unwrap_err()
            .starts_with("path: a pattern with *"));
    }

    #[test]
    fn like_escaping() {
        assert_eq!(like_pattern("/x*"), "/x_%");
        assert_eq!(like_pattern("/100%_\\"), "/100\\%\\_\\\\");
    }

    #[test]
    fn days_and_quantiles() {
        assert_eq!(parse_days(None), Ok(30));
        assert_eq!(parse_days(Some("90")), Ok(90));
        assert!(parse_days(Some("91")).is_err());
        assert!(parse_days(Some("0")).is_err());
        assert_eq!(quantile_offset(0, 0.5), 0);
        assert_eq!(quantile_offset(1, 0.95), 0);
        assert_eq!(quantile_offset(100, 0.5), 49);
        assert_eq!(quantile_offset(100, 0.95), 94);
        assert_eq!(quantile_offset(10, 0.95), 9);
        assert_eq!(retention_cutoff_ms(100 * 86_400_000, 90), 10 * 86_400_000);
    }

    #[test]
    fn writer_bounds() {
        assert!(may_queue(0));
        assert!(may_queue(MAX_PENDING - 1));
        assert!(!may_queue(MAX_PENDING));
        assert!(must_start_flusher(0, 5));
        assert!(!must_start_flusher(1_000, 1_000 + FLUSHER_STALE_MS - 1));
        assert!(
            must_start_flusher(1_000, 1_000 + FLUSHER_STALE_MS),
            "a stuck flag expires"
        );
        assert!(
            !must_start_flusher(5_000, 1_000),
            "a clock step back keeps the running flusher"
        );
    }
}
