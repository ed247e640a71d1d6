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

/// One request as recorded (docs/audit-log.md).
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
    /// The origin a proxied request was routed to (`default` or a name).
    #[serde(default)]
    pub origin: Option<String>,
    /// Report-only limits: the policy (or `inflight`) that would have
    /// refused this forwarded request.
    #[serde(default)]
    pub would_refuse: Option<String>,
    /// How the request counts in `/usage` and `/stats`. Not stored with the
    /// row: its shard's roll-ups keep the counts (a row read back has none).
    #[serde(default, skip_serializing_if = "Counted::is_none")]
    pub counted: Counted,
}

/// What the shell knew of a request that `/usage` and `/stats` count
/// ([`crate::audit_shard::usage`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counted {
    /// It was forwarded to the origin (whatever the answer).
    #[serde(default)]
    pub forwarded: bool,
    /// It counts once toward billing (`usage::billable`).
    #[serde(default)]
    pub billable: bool,
    /// It had no Idempotency-Key where the mode is `required`.
    #[serde(default)]
    pub missing_key: bool,
}

impl Counted {
    pub fn is_none(&self) -> bool {
        *self == Counted::default()
    }
}

pub const MAX_PATH_LEN: usize = 1024;
pub const MAX_USER_AGENT_LEN: usize = 512;
/// Fields of a row without a valid API key are kept this short: anyone can
/// send such requests, so they must not buy storage.
pub const UNAUTHENTICATED_FIELD_LEN: usize = 128;

/// The longest `path` filter (characters).
pub const MAX_PATH_FILTER_LEN: usize = 128;
/// The most `*` wildcards in one `path` filter.
pub const MAX_PATH_FILTER_STARS: usize = 4;
/// D1's limit on a LIKE/GLOB pattern (bytes); longer ones fail the query.
pub const MAX_GLOB_BYTES: usize = 50;

impl AuditRow {
    /// A row of a request that presented no valid API key: its free-text
    /// fields truncated to [`UNAUTHENTICATED_FIELD_LEN`].
    pub fn shortened_if_unauthenticated(mut self) -> AuditRow {
        if self.key_prefix.is_some() {
            return self;
        }
        let n = UNAUTHENTICATED_FIELD_LEN;
        self.path = bounded(&self.path, n);
        self.user_agent = self.user_agent.map(|v| bounded(&v, n));
        self.idempotency_key = self.idempotency_key.map(|v| bounded(&v, n));
        self
    }
}

/// Truncates to at most `n` characters (stored strings are bounded).
pub fn bounded(s: &str, n: usize) -> String {
    // Cut at the byte offset of the n-th character and copy once (collecting
    // the characters pushes them one by one).
    let end = s.char_indices().nth(n).map_or(s.len(), |(i, _)| i);
    s[..end].to_string()
}

/// A value bound to a `?` placeholder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arg {
    Text(String),
    Int(i64),
}

/// `status=` filter: an exact code or a class (`4xx`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum StatusFilter {
    Exact(u16),
    Class(u16),
}

/// A parsed, validated `GET /audit` query. Serialised as is to the audit
/// shards (`crate::audit_shard`), which run it with [`AuditQuery::sql_on`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
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
    /// `include_gateway=false`: leave out the gateway's own calls (its API,
    /// the dashboard's reads), [`crate::routes::is_gateway_path`].
    #[serde(default)]
    pub exclude_gateway: bool,
}

/// `include_gateway=` of `/audit` and `/stats`: `true` (the default: every
/// request) or `false` (only requests proxied to the origin); the answer is
/// whether to leave the gateway's own calls out.
pub fn parse_include_gateway(v: &str) -> Result<bool, Invalid> {
    match v {
        "true" => Ok(false),
        "false" => Ok(true),
        _ => Err(bad("include_gateway", "must be true or false")),
    }
}

fn bad(field: &str, why: &str) -> Invalid {
    Invalid::field(field, why)
}

// Times are read as every input reads them (re-exported: their first home).
pub use crate::times::{parse_time, time_value, MAX_EPOCH_MS};

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
                "path" => q.path = Some(parse_path_filter(v)?),
                "idempotency_key" => q.idempotency_key = Some(text(k, v, 255)?),
                "key_prefix" => q.key_prefix = Some(text(k, v, 12)?),
                "project" if allow_project => {
                    if !crate::ids::is_valid_name(v) {
                        return Err(bad(k, "must be 1-64 characters of [A-Za-z0-9._-]"));
                    }
                    q.project = Some(v.to_string());
                }
                "since" => q.since = Some(parse_time(k, v)?),
                "until" => q.until = Some(parse_time(k, v)?),
                "limit" => q.limit = parse_limit(Some(v))?,
                "cursor" => q.cursor = Some(decode_cursor(v)?),
                "include_gateway" => q.exclude_gateway = parse_include_gateway(v)?,
                other => return Err(bad(&bounded(other, 64), "unknown parameter")),
            }
        }
        Ok(q)
    }

    /// The SQL (for the legacy D1 table) and its arguments. Fetches
    /// `limit + 1` rows so the caller knows whether a next page exists.
    pub fn to_sql(&self) -> (String, Vec<Arg>) {
        self.sql_on("audit_log", COLUMNS, true, self.limit + 1)
    }

    /// The SQL over `table` (selecting `columns`), at most `take` rows,
    /// newest first. `with_project`: whether the table has a `project`
    /// column to filter on (a shard holds one project and has none).
    pub fn sql_on(
        &self,
        table: &str,
        columns: &str,
        with_project: bool,
        take: u32,
    ) -> (String, Vec<Arg>) {
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
        if with_project {
            eq("project = ?", &self.project, &mut wh);
        }
        // Without `*` the match is exact (and case-sensitive, as paths are);
        // with it, GLOB (case-sensitive too, unlike LIKE).
        match &self.path {
            Some(p) if p.contains('*') => {
                wh.push("path GLOB ?");
                args.push(Arg::Text(glob_pattern(p)));
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
        let not_gateway = format!("NOT {}", crate::routes::GATEWAY_PATH_SQL);
        if self.exclude_gateway {
            wh.push(&not_gateway);
        }
        if let Some((t, id)) = &self.cursor {
            wh.push("(time < ? OR (time = ? AND request_id < ?))");
            args.push(Arg::Int(ms(*t)));
            args.push(Arg::Int(ms(*t)));
            args.push(Arg::Text(id.clone()));
        }
        let mut sql = format!("SELECT {columns} FROM {table}");
        if !wh.is_empty() {
            sql.push_str(" WHERE ");
            sql.push_str(&wh.join(" AND "));
        }
        sql.push_str(" ORDER BY time DESC, request_id DESC LIMIT ?");
        args.push(Arg::Int(i64::from(take)));
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

/// A `path` filter: starts with `/`, at most [`MAX_PATH_FILTER_LEN`]
/// characters and [`MAX_PATH_FILTER_STARS`] wildcards, and (with `*`) a GLOB
/// pattern D1 accepts. Bad input is a 400, never a failing query.
pub fn parse_path_filter(v: &str) -> Result<String, Invalid> {
    const F: &str = "path";
    if !v.starts_with('/') {
        return Err(bad(F, "must start with / (use * as a wildcard)"));
    }
    let p = text(F, v, MAX_PATH_FILTER_LEN)?;
    let stars = p.matches('*').count();
    if stars > MAX_PATH_FILTER_STARS {
        return Err(bad(
            F,
            &format!("may contain at most {MAX_PATH_FILTER_STARS} * wildcards"),
        ));
    }
    if stars > 0 && glob_pattern(&p).len() > MAX_GLOB_BYTES {
        return Err(bad(
            F,
            &format!("a pattern with * may be at most {MAX_GLOB_BYTES} bytes once translated (each * counts 2, each ? [ ] counts 3); match exactly without *"),
        ));
    }
    Ok(p)
}

/// `*` (one or more characters) → `?*`; GLOB's own `?`, `[` and `]` are
/// made literal by bracketing them.
pub fn glob_pattern(p: &str) -> String {
    let mut out = String::with_capacity(p.len() + 4);
    for c in p.chars() {
        match c {
            '*' => out.push_str("?*"),
            '?' | '[' | ']' => {
                out.push('[');
                out.push(c);
                out.push(']');
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
    fn times_are_epoch_ms_or_rfc3339_with_offset_and_fraction() {
        assert_eq!(
            parse_time("since", "2026-01-01T00:00:00Z"),
            Ok(1_767_225_600_000)
        );
        assert_eq!(
            parse_time("since", "2026-01-01T02:00:00.250+02:00"),
            Ok(1_767_225_600_250)
        );
        assert_eq!(
            parse_time("since", "2026-01-01t00:00:00.5z"),
            Ok(1_767_225_600_500)
        );
        assert_eq!(parse_time("since", "1970-01-01T00:00:00Z"), Ok(0));
        for bad in [
            "1969-12-31T23:59:59Z",
            "2026-01-01",
            "2026-13-01T00:00:00Z",
            "-1",
        ] {
            assert!(parse_time("since", bad).is_err(), "{bad}");
        }
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
        assert!(sql.contains("path GLOB ?"));
        assert!(args.contains(&Arg::Text("/a_b/?*".into())));
        assert!(args.contains(&Arg::Int(500)) && args.contains(&Arg::Int(600)));
        assert_eq!(args.last(), Some(&Arg::Int(51)));
    }

    #[test]
    fn gateway_calls_can_be_left_out() {
        let q = parse(&[("include_gateway", "false")], false).unwrap();
        assert!(q.exclude_gateway);
        let (sql, args) = q.to_sql();
        assert!(sql.contains(&format!("NOT {}", crate::routes::GATEWAY_PATH_SQL)));
        assert_eq!(sql.matches('?').count(), args.len());
        let all = parse(&[("include_gateway", "true")], false).unwrap();
        assert!(!all.exclude_gateway);
        assert!(!all.to_sql().0.contains("GLOB"));
        assert!(
            !parse(&[], false).unwrap().exclude_gateway,
            "every request by default"
        );
        for bad in ["yes", "", "FALSE", "0"] {
            assert!(parse(&[("include_gateway", bad)], false).is_err(), "{bad}");
        }
    }

    #[test]
    fn glob_escaping() {
        assert_eq!(glob_pattern("/x*"), "/x?*");
        assert_eq!(glob_pattern("/a?[b]*%_"), "/a[?][[]b[]]?*%_");
    }

    #[test]
    fn path_filters_are_bounded_and_exact_without_a_wildcard() {
        let long = format!("/{}", "a".repeat(199));
        assert!(parse_path_filter(&long).is_err());
        assert!(parse_path_filter(&format!("/{}*", "a".repeat(60))).is_err());
        assert!(parse_path_filter("/a*/b*/c*/d*/e*").is_err());
        assert!(parse_path_filter("/a*/b*/c*/d*").is_ok());
        let exact = format!("/{}", "a".repeat(100));
        assert_eq!(parse_path_filter(&exact).as_deref(), Ok(exact.as_str()));
        let q = parse(&[("path", "/Orders")], false).unwrap();
        let (sql, args) = q.to_sql();
        assert!(sql.contains("path = ?") && !sql.contains("LIKE"));
        assert!(args.contains(&Arg::Text("/Orders".into())));
    }

    #[test]
    fn unauthenticated_rows_keep_short_fields() {
        let row = AuditRow {
            request_id: "req_1".into(),
            time: 0,
            method: "GET".into(),
            path: format!("/{}", "p".repeat(900)),
            status: 401,
            response_bytes: None,
            response_time_ms: 0,
            client_ip: None,
            user_agent: Some("u".repeat(500)),
            key_prefix: None,
            project: None,
            idempotency_key: Some("k".repeat(255)),
            replayed: false,
            rate_limit_remaining: None,
            origin: None,
            would_refuse: None,
            counted: Default::default(),
        };
        let short = row.clone().shortened_if_unauthenticated();
        assert_eq!(short.path.chars().count(), UNAUTHENTICATED_FIELD_LEN);
        assert_eq!(
            short.user_agent.map(|u| u.len()),
            Some(UNAUTHENTICATED_FIELD_LEN)
        );
        assert_eq!(
            short.idempotency_key.map(|u| u.len()),
            Some(UNAUTHENTICATED_FIELD_LEN)
        );
        let keyed = AuditRow {
            key_prefix: Some("pgk_x".into()),
            ..row.clone()
        };
        assert_eq!(keyed.clone().shortened_if_unauthenticated(), keyed);
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
