//! The audit log in shards: one SQLite Durable Object per (project, time
//! bucket), found through a small directory in D1 (ADR 0016).
//!
//! Everything decided about shards is here: which shard a row goes to and
//! its name, which shards a query visits and in which order, merging their
//! answers newest first, the hourly roll-ups a batch adds (only for rows it
//! really inserted, so a retried batch never counts twice), and `/stats`
//! arithmetic (days, top paths, exact percentiles from latency counts). The
//! object (`src/durable/audit_shard.rs`) is an adapter over [`ShardStore`].

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::audit::{AuditQuery, AuditRow};
use crate::{ErrorCode, Problem};

/// The shard "project" of rows that belong to no project (requests without
/// a valid API key). `~` is not allowed in project names, so no project can
/// ever read or collide with it.
pub const UNSCOPED: &str = "~none";
/// The shard "project" holding, per bucket, the roll-ups of every project
/// (no rows): the operator's `/stats` without `project` reads one object per
/// bucket instead of one per project and bucket.
pub const ALL_PROJECTS: &str = "~all";
pub const HOUR_MS: u64 = 3_600_000;
pub const DAY_MS: u64 = 86_400_000;
/// Default bucket: one UTC day (ADR 0016 has the numbers).
pub const DEFAULT_BUCKET_MS: u64 = DAY_MS;
/// The smallest and largest `audit.bucket_ms` accepted (tests use seconds).
pub const MIN_BUCKET_MS: u64 = 1_000;
pub const MAX_BUCKET_MS: u64 = 31 * DAY_MS;
/// Response times above this are counted as this in the latency roll-up
/// (bounds its distinct values; far beyond any origin timeout).
pub const MAX_LATENCY_MS: u64 = 600_000;
/// Shards of one bucket the operator's cross-project `/audit` queries at once
/// (beyond it: 400 `AUDIT_PROJECT_REQUIRED`).
pub const MAX_FANOUT: usize = 32;
/// Shards one `/stats` answer reads at most (beyond it, without `project`:
/// 400 `AUDIT_PROJECT_REQUIRED`; with it, the newest this many).
pub const MAX_STATS_SHARDS: usize = 256;

/// One shard: a project's rows with `start_ms <= time < end_ms`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Shard {
    pub project: String,
    pub start_ms: u64,
    pub end_ms: u64,
}

impl Shard {
    /// The shard of a row recorded at `time` for `project` (None = no
    /// project): buckets are aligned on multiples of `bucket_ms` since the
    /// epoch, so one-day buckets are UTC days.
    pub fn of(project: Option<&str>, time: u64, bucket_ms: u64) -> Shard {
        let b = bucket_ms.max(1);
        let start_ms = time / b * b;
        Shard {
            project: project.unwrap_or(UNSCOPED).to_string(),
            start_ms,
            end_ms: start_ms.saturating_add(b),
        }
    }

    /// The object's name (`idFromName`).
    pub fn name(&self) -> String {
        format!("{}/{}", self.project, self.start_ms)
    }

    /// The cross-project roll-up shard of the same bucket.
    pub fn all_projects(&self) -> Shard {
        Shard {
            project: ALL_PROJECTS.to_string(),
            ..self.clone()
        }
    }

    /// The `project` of the rows this shard returns.
    pub fn row_project(&self) -> Option<String> {
        (self.project != UNSCOPED).then(|| self.project.clone())
    }
}

/// Rows grouped by shard, in the order each shard first appears: one object
/// call per group. A list, not a map: a batch spans a few shards, and a
/// `BTreeMap<Shard, _>` would be one more map type in the wasm (ADR 0026).
pub fn group(rows: Vec<AuditRow>, bucket_ms: u64) -> Vec<(Shard, Vec<AuditRow>)> {
    let mut out: Vec<(Shard, Vec<AuditRow>)> = Vec::new();
    for r in rows {
        let shard = Shard::of(r.project.as_deref(), r.time, bucket_ms);
        match out.iter_mut().find(|(s, _)| *s == shard) {
            Some((_, group)) => group.push(r),
            None => out.push((shard, vec![r])),
        }
    }
    out
}

/// Where a query's rows may be: a shard, or the legacy D1 table
/// (`audit_log`, read-only since migration 0006) over the times it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Shard(Shard),
    Legacy { start_ms: u64, end_ms: u64 },
}

impl Source {
    fn span(&self) -> (u64, u64) {
        match self {
            Source::Shard(s) => (s.start_ms, s.end_ms),
            Source::Legacy { start_ms, end_ms } => (*start_ms, *end_ms),
        }
    }
}

/// The time range a query can match: `lo <= time <= hi`; `shards`: whether
/// shards can hold a match at all (a `request_id=` the gateway did not make
/// can only be a legacy row's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub lo: u64,
    pub hi: u64,
    pub shards: bool,
}

/// The creation time of a gateway request id (`req_` + ULID). The gateway
/// makes the id from the request's start, the row's `time`: one bucket.
pub fn request_id_time(id: &str) -> Option<u64> {
    let u = ulid::Ulid::from_string(id.strip_prefix("req_")?).ok()?;
    Some(u.timestamp_ms())
}

impl Bounds {
    /// From `since`, `until`, the cursor and `request_id`.
    pub fn of(q: &AuditQuery) -> Bounds {
        let mut hi = q.until.unwrap_or(u64::MAX);
        if let Some((t, _)) = &q.cursor {
            hi = hi.min(*t);
        }
        let mut lo = q.since.unwrap_or(0);
        let mut shards = true;
        match q.request_id.as_deref().map(request_id_time) {
            Some(Some(t)) => {
                hi = hi.min(t);
                lo = lo.max(t);
            }
            Some(None) => shards = false,
            None => {}
        }
        Bounds { lo, hi, shards }
    }
}

/// The sources to visit, as bands of time-overlapping sources, newest band
/// first. Shards of one bucket form one band (their answers are merged);
/// bands are time-disjoint, so their concatenation is newest first and a
/// cursor stays valid across band boundaries.
pub fn plan(mut sources: Vec<Source>, b: Bounds) -> Vec<Vec<Source>> {
    sources.retain(|s| {
        let (start, end) = s.span();
        let kind = b.shards || matches!(s, Source::Legacy { .. });
        kind && end > b.lo && start <= b.hi && b.lo <= b.hi
    });
    sources.sort_by_key(|s| std::cmp::Reverse(s.span()));
    let mut bands: Vec<Vec<Source>> = Vec::new();
    let mut band_start = u64::MAX;
    for s in sources {
        let (start, end) = s.span();
        match bands.last_mut() {
            Some(band) if end > band_start => {
                band.push(s);
                band_start = band_start.min(start);
            }
            _ => {
                bands.push(vec![s]);
                band_start = start;
            }
        }
    }
    bands
}

/// 400 `AUDIT_PROJECT_REQUIRED` when a band is wider than [`MAX_FANOUT`].
pub fn check_fanout(bands: &[Vec<Source>]) -> Result<(), Problem> {
    match bands.iter().map(Vec::len).max() {
        Some(n) if n > MAX_FANOUT => Err(project_required(&format!(
            "this time range holds {n} projects' audit shards (at most {MAX_FANOUT} are read at once): add project=, or narrow since/until"
        ))),
        _ => Ok(()),
    }
}

pub fn project_required(detail: &str) -> Problem {
    Problem::new(ErrorCode::AuditProjectRequired, detail)
}

/// Merges the answers of one band: newest first by `(time, request_id)`,
/// at most `take`.
pub fn merge(answers: Vec<Vec<AuditRow>>, take: usize) -> Vec<AuditRow> {
    let mut rows: Vec<AuditRow> = answers.into_iter().flatten().collect();
    rows.sort_by(|a, b| (b.time, &b.request_id).cmp(&(a.time, &a.request_id)));
    rows.truncate(take);
    rows
}

/// The counts one batch adds to a shard's hourly roll-ups. `key_prefix` is
/// "" for rows without one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rollups {
    pub paths: Vec<PathDelta>,
    pub latency: Vec<LatencyDelta>,
    /// The part of `latency` that is the gateway's own calls
    /// ([`crate::routes::is_gateway_path`]): `/stats?include_gateway=false`
    /// subtracts it (the `paths` roll-up tells them apart by its path).
    /// Counted from 0.4 on; a batch from before has none.
    #[serde(default)]
    pub latency_gateway: Vec<LatencyDelta>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathDelta {
    pub hour: u64,
    pub key_prefix: String,
    pub path: String,
    pub requests: u64,
    pub errors: u64,
    pub server_errors: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LatencyDelta {
    pub hour: u64,
    pub key_prefix: String,
    pub ms: u64,
    pub n: u64,
}

/// Counts summed by key, in key order. Every roll-up here (a batch's paths and
/// latency, `/stats`' days, paths and latency) is one of these, so the wasm
/// holds one `BTreeMap` type for all five instead of five (ADR 0026). A use
/// leaves the key parts and counts it does not need at 0 or "".
#[derive(Default)]
struct Tally(BTreeMap<(u64, String, String, u64), [u64; 3]>);

impl Tally {
    fn add(&mut self, key: (u64, String, String, u64), counts: [u64; 3]) {
        let sum = self.0.entry(key).or_default();
        for (s, c) in sum.iter_mut().zip(counts) {
            *s += c;
        }
    }
}

impl Rollups {
    /// The sum of several batches' counts (same keys added up).
    pub fn sum(parts: Vec<Rollups>) -> Rollups {
        let mut paths = Tally::default();
        let mut latency = Tally::default();
        let mut latency_gateway = Tally::default();
        for p in parts {
            for d in p.paths {
                let counts = [d.requests, d.errors, d.server_errors];
                paths.add((d.hour, d.key_prefix, d.path, 0), counts);
            }
            for d in p.latency {
                latency.add((d.hour, d.key_prefix, String::new(), d.ms), [d.n, 0, 0]);
            }
            for d in p.latency_gateway {
                latency_gateway.add((d.hour, d.key_prefix, String::new(), d.ms), [d.n, 0, 0]);
            }
        }
        let deltas = |t: Tally| -> Vec<LatencyDelta> {
            t.0.into_iter()
                .map(|((hour, key_prefix, _, ms), c)| LatencyDelta {
                    hour,
                    key_prefix,
                    ms,
                    n: c[0],
                })
                .collect()
        };
        Rollups {
            paths: paths
                .0
                .into_iter()
                .map(|((hour, key_prefix, path, _), c)| PathDelta {
                    hour,
                    key_prefix,
                    path,
                    requests: c[0],
                    errors: c[1],
                    server_errors: c[2],
                })
                .collect(),
            latency: deltas(latency),
            latency_gateway: deltas(latency_gateway),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.paths.is_empty() && self.latency.is_empty() && self.latency_gateway.is_empty()
    }

    /// The counts of these rows: one delta per row, summed by [`Rollups::sum`]
    /// (one map type for both, which keeps the wasm smaller than a second,
    /// borrowed-key map would; the strings are a batch's, a few hundred at most).
    pub fn of(rows: &[&AuditRow]) -> Rollups {
        let mut one = Rollups::default();
        for r in rows {
            let hour = r.time / HOUR_MS * HOUR_MS;
            let kp = r.key_prefix.clone().unwrap_or_default();
            one.paths.push(PathDelta {
                hour,
                key_prefix: kp.clone(),
                path: r.path.clone(),
                requests: 1,
                errors: u64::from(r.status >= 400),
                server_errors: u64::from(r.status >= 500),
            });
            let latency = LatencyDelta {
                hour,
                key_prefix: kp,
                ms: r.response_time_ms.min(MAX_LATENCY_MS),
                n: 1,
            };
            if crate::routes::is_gateway_path(&r.path) {
                one.latency_gateway.push(latency.clone());
            }
            one.latency.push(latency);
        }
        Rollups::sum(vec![one])
    }
}

/// What `/stats` asks a shard: roll-ups from `since_ms` (hour-aligned), for
/// one key or all.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatsQuery {
    pub since_ms: u64,
    pub key_prefix: Option<String>,
    /// `include_gateway=false`: the gateway's own calls are not counted.
    #[serde(default)]
    pub exclude_gateway: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HourCount {
    pub hour: u64,
    pub requests: u64,
    pub errors: u64,
    pub server_errors: u64,
}

/// One shard's roll-ups over a `StatsQuery`: per hour, per path, and
/// `(ms, count)` latency pairs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardStats {
    pub hours: Vec<HourCount>,
    pub paths: Vec<PathCount>,
    pub latency: Vec<(u64, u64)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Day {
    pub date: String,
    pub requests: u64,
    pub errors: u64,
    pub server_errors: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathCount {
    pub path: String,
    pub requests: u64,
}

/// The `/stats` answer (docs/audit-log.md).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Stats {
    pub days: Vec<Day>,
    pub top_paths: Vec<PathCount>,
    pub error_share: f64,
    pub p50_ms: Option<u64>,
    pub p95_ms: Option<u64>,
}

/// `YYYY-MM-DD` (UTC) of an epoch-ms time. Fields, not a formatter: one fixed
/// layout needs no format machinery in the wasm.
fn utc_date(ms: u64) -> String {
    i64::try_from(ms / 1000)
        .ok()
        .and_then(|s| time::OffsetDateTime::from_unix_timestamp(s).ok())
        .map(|t| format!("{:04}-{:02}-{:02}", t.year(), u8::from(t.month()), t.day()))
        .unwrap_or_default()
}

/// The value at nearest-rank quantile `q` of a histogram: `(value, count)`
/// pairs in ascending value order.
pub fn percentile(counts: &[(u64, u64)], q: f64) -> Option<u64> {
    let n: u64 = counts.iter().map(|(_, c)| c).sum();
    if n == 0 {
        return None;
    }
    let offset = crate::audit::quantile_offset(n, q);
    let mut seen = 0u64;
    for (ms, c) in counts {
        seen += c;
        if seen > offset {
            return Some(*ms);
        }
    }
    None
}

/// `/stats` from the shards' roll-ups: exactly what a scan of the rows gives.
pub fn merge_stats(parts: Vec<ShardStats>) -> Stats {
    // Days keyed by their first millisecond (UTC), which orders them as dates.
    let (mut days, mut paths, mut latency) = (Tally::default(), Tally::default(), Tally::default());
    let none = String::new;
    for p in parts {
        for h in p.hours {
            let day = h.hour / DAY_MS * DAY_MS;
            let counts = [h.requests, h.errors, h.server_errors];
            days.add((day, none(), none(), 0), counts);
        }
        for c in p.paths {
            // An endpoint, not a URL: every idempotency lookup is one row.
            let path = match crate::routes::template_of(&c.path) {
                Some(t) => t.to_string(),
                None => c.path,
            };
            paths.add((0, path, none(), 0), [c.requests, 0, 0]);
        }
        for (ms, n) in p.latency {
            latency.add((ms, none(), none(), 0), [n, 0, 0]);
        }
    }
    let days: Vec<Day> = days
        .0
        .into_iter()
        .map(|((day, ..), c)| Day {
            date: utc_date(day),
            requests: c[0],
            errors: c[1],
            server_errors: c[2],
        })
        .collect();
    let latency: Vec<(u64, u64)> = latency
        .0
        .into_iter()
        .map(|((ms, ..), c)| (ms, c[0]))
        .collect();
    let mut top: Vec<PathCount> = paths
        .0
        .into_iter()
        .map(|((_, path, ..), c)| PathCount {
            path,
            requests: c[0],
        })
        .collect();
    top.sort_by(|a, b| {
        b.requests
            .cmp(&a.requests)
            .then_with(|| a.path.cmp(&b.path))
    });
    top.truncate(10);
    let total: u64 = days.iter().map(|d| d.requests).sum();
    let errors: u64 = days.iter().map(|d| d.errors).sum();
    Stats {
        days,
        top_paths: top,
        error_share: if total == 0 {
            0.0
        } else {
            errors as f64 / total as f64
        },
        p50_ms: percentile(&latency, 0.50),
        p95_ms: percentile(&latency, 0.95),
    }
}

/// When a key was last used, and how much, over a window: one project's
/// shards answer [`KEY_ACTIVITY_SQL`], [`merge_key_activity`] adds them up
/// (`GET /keys/activity`, the dashboard's "Last used"). Read from the
/// roll-ups and the rows that already exist: nothing is written per request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyActivity {
    pub key_prefix: String,
    pub requests: u64,
    pub errors: u64,
    /// The time of its latest request (epoch ms).
    pub last_used_at: u64,
}

/// A shard's [`KeyActivity`] from hour `?1` on: the counts from the path
/// roll-up, the latest time from the rows of the key's latest hour (the
/// hour itself when the rows are gone, which never happens in a shard).
pub const KEY_ACTIVITY_SQL: &str = "SELECT p.key_prefix AS key_prefix, p.r AS requests, p.e AS errors, \
COALESCE((SELECT MAX(time) FROM rows WHERE key_prefix = p.key_prefix AND time >= p.h), p.h) AS last_used_at \
FROM (SELECT key_prefix, SUM(requests) AS r, SUM(errors) AS e, MAX(hour) AS h FROM paths \
WHERE hour >= ?1 AND key_prefix != '' GROUP BY key_prefix) p";

/// The shards' answers added up per key, the most recently used first.
pub fn merge_key_activity(parts: Vec<Vec<KeyActivity>>) -> Vec<KeyActivity> {
    let mut out: Vec<KeyActivity> = Vec::new();
    for k in parts.into_iter().flatten() {
        match out.iter_mut().find(|o| o.key_prefix == k.key_prefix) {
            Some(o) => {
                o.requests += k.requests;
                o.errors += k.errors;
                o.last_used_at = o.last_used_at.max(k.last_used_at);
            }
            None => out.push(k),
        }
    }
    out.sort_by(|a, b| {
        b.last_used_at
            .cmp(&a.last_used_at)
            .then_with(|| a.key_prefix.cmp(&b.key_prefix))
    });
    out
}

/// A shard's storage: the object's SQLite tables, or memory in tests. Every
/// method runs inside one transaction of the caller (`transactionSync`).
pub trait ShardStore {
    type Error;
    /// Which of these request ids are stored already.
    fn existing(&mut self, ids: &[&str]) -> Result<Vec<String>, Self::Error>;
    /// Stores rows (none of which is stored yet).
    fn insert(&mut self, rows: &[&AuditRow]) -> Result<(), Self::Error>;
    /// Adds counts to the roll-ups.
    fn add(&mut self, rollups: &Rollups) -> Result<(), Self::Error>;
}

/// What one ingest did: how many rows were new, and the counts they added
/// (which the writer adds to the bucket's [`ALL_PROJECTS`] shard too).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ingested {
    pub inserted: usize,
    pub rollups: Rollups,
}

/// Stores a batch and its roll-ups: rows already stored (a retried batch)
/// and repeats within the batch are skipped, and count nowhere.
pub fn ingest<S: ShardStore>(s: &mut S, rows: &[AuditRow]) -> Result<Ingested, S::Error> {
    let ids: Vec<&str> = rows.iter().map(|r| r.request_id.as_str()).collect();
    // One set for both (stored, then seen in this batch): `insert` is false for
    // either, and `HashSet<String>` is a type the wasm has already (ADR 0026).
    let mut known: HashSet<String> = s.existing(&ids)?.into_iter().collect();
    let fresh: Vec<&AuditRow> = rows
        .iter()
        .filter(|r| known.insert(r.request_id.clone()))
        .collect();
    if fresh.is_empty() {
        return Ok(Ingested::default());
    }
    s.insert(&fresh)?;
    let rollups = Rollups::of(&fresh);
    s.add(&rollups)?;
    Ok(Ingested {
        inserted: fresh.len(),
        rollups,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::StatusFilter;

    /// The in-memory backend: rows and roll-ups as the object keeps them.
    #[derive(Default)]
    struct Mem {
        rows: BTreeMap<String, AuditRow>,
        paths: BTreeMap<(u64, String, String), [u64; 3]>,
        latency: BTreeMap<(u64, String, u64), u64>,
        latency_gw: BTreeMap<(u64, String, u64), u64>,
    }

    impl ShardStore for Mem {
        type Error = ();
        fn existing(&mut self, ids: &[&str]) -> Result<Vec<String>, ()> {
            Ok(ids
                .iter()
                .filter(|i| self.rows.contains_key(**i))
                .map(|i| i.to_string())
                .collect())
        }
        fn insert(&mut self, rows: &[&AuditRow]) -> Result<(), ()> {
            for r in rows {
                assert!(self
                    .rows
                    .insert(r.request_id.clone(), (*r).clone())
                    .is_none());
            }
            Ok(())
        }
        fn add(&mut self, r: &Rollups) -> Result<(), ()> {
            for p in &r.paths {
                let c = self
                    .paths
                    .entry((p.hour, p.key_prefix.clone(), p.path.clone()))
                    .or_default();
                c[0] += p.requests;
                c[1] += p.errors;
                c[2] += p.server_errors;
            }
            for l in &r.latency {
                *self
                    .latency
                    .entry((l.hour, l.key_prefix.clone(), l.ms))
                    .or_default() += l.n;
            }
            for l in &r.latency_gateway {
                *self
                    .latency_gw
                    .entry((l.hour, l.key_prefix.clone(), l.ms))
                    .or_default() += l.n;
            }
            Ok(())
        }
    }

    impl Mem {
        /// What the object's `/stats` query returns.
        fn stats(&self, q: &StatsQuery) -> ShardStats {
            let ok = |h: u64, kp: &str| {
                h >= q.since_ms && q.key_prefix.as_deref().is_none_or(|k| k == kp)
            };
            let mut hours: BTreeMap<u64, HourCount> = BTreeMap::new();
            let mut paths: BTreeMap<String, u64> = BTreeMap::new();
            for ((h, kp, path), c) in &self.paths {
                if ok(*h, kp) && !(q.exclude_gateway && crate::routes::is_gateway_path(path)) {
                    let e = hours.entry(*h).or_insert(HourCount {
                        hour: *h,
                        ..HourCount::default()
                    });
                    e.requests += c[0];
                    e.errors += c[1];
                    e.server_errors += c[2];
                    *paths.entry(path.clone()).or_default() += c[0];
                }
            }
            let mut latency: BTreeMap<u64, u64> = BTreeMap::new();
            for ((h, kp, ms), n) in &self.latency {
                if ok(*h, kp) {
                    *latency.entry(*ms).or_default() += n;
                }
            }
            if q.exclude_gateway {
                for ((h, kp, ms), n) in &self.latency_gw {
                    if ok(*h, kp) {
                        *latency.entry(*ms).or_default() -= n;
                    }
                }
                latency.retain(|_, n| *n > 0);
            }
            ShardStats {
                hours: hours.into_values().collect(),
                paths: paths
                    .into_iter()
                    .map(|(path, requests)| PathCount { path, requests })
                    .collect(),
                latency: latency.into_iter().collect(),
            }
        }
    }

    fn row(id: &str, time: u64, path: &str, status: u16, ms: u64, kp: Option<&str>) -> AuditRow {
        AuditRow {
            request_id: id.into(),
            time,
            method: "GET".into(),
            path: path.into(),
            status,
            response_bytes: None,
            response_time_ms: ms,
            client_ip: None,
            user_agent: None,
            key_prefix: kp.map(Into::into),
            project: Some("acme".into()),
            idempotency_key: None,
            replayed: false,
            rate_limit_remaining: None,
        }
    }

    #[test]
    fn shards_are_named_by_project_and_aligned_bucket() {
        let s = Shard::of(Some("acme"), DAY_MS * 3 + 5, DAY_MS);
        assert_eq!(s.name(), format!("acme/{}", DAY_MS * 3));
        assert_eq!(s.end_ms, DAY_MS * 4);
        let none = Shard::of(None, 1_999, 1_000);
        assert_eq!((none.project.as_str(), none.start_ms), (UNSCOPED, 1_000));
        assert_eq!(none.row_project(), None);
        assert!(!crate::ids::is_valid_name(UNSCOPED));
        let g = group(
            vec![
                row("a", 10, "/", 200, 1, None),
                row("b", 1_010, "/", 200, 1, None),
                row("c", 20, "/", 200, 1, None),
            ],
            1_000,
        );
        let sizes: Vec<(u64, usize)> = g.iter().map(|(s, r)| (s.start_ms, r.len())).collect();
        assert_eq!(sizes, vec![(0, 2), (1_000, 1)]);
        let ids: Vec<&str> = g[0].1.iter().map(|r| r.request_id.as_str()).collect();
        assert_eq!(ids, ["a", "c"]);
    }

    #[test]
    fn a_retried_batch_counts_once() {
        let mut m = Mem::default();
        let batch = vec![
            row("r1", HOUR_MS + 1, "/a", 200, 5, Some("pgk_a")),
            row("r2", HOUR_MS + 2, "/a", 503, 7, Some("pgk_a")),
            row("r2", HOUR_MS + 2, "/a", 503, 7, Some("pgk_a")),
        ];
        let first = ingest(&mut m, &batch).unwrap();
        assert_eq!(first.inserted, 2);
        assert_eq!(
            ingest(&mut m, &batch),
            Ok(Ingested::default()),
            "a retry inserts and counts nothing"
        );
        let mut more = batch.clone();
        more.push(row("r3", 2 * HOUR_MS, "/b", 404, 900_000, None));
        let second = ingest(&mut m, &more).unwrap();
        assert_eq!(second.inserted, 1);
        // The cross-project shard gets what the project shards added, summed.
        let mut all = Mem::default();
        all.add(&Rollups::sum(vec![first.rollups, second.rollups]))
            .unwrap();
        assert_eq!(
            (all.paths.clone(), all.latency.clone()),
            (m.paths.clone(), m.latency.clone())
        );
        assert_eq!(m.paths[&(HOUR_MS, "pgk_a".into(), "/a".into())], [2, 1, 1]);
        assert_eq!(m.latency[&(2 * HOUR_MS, String::new(), MAX_LATENCY_MS)], 1);
        let all = merge_stats(vec![m.stats(&StatsQuery {
            since_ms: 0,
            key_prefix: None,
            exclude_gateway: false,
        })]);
        assert_eq!(all.days[0].requests, 3);
        assert_eq!(all.days[0].date, "1970-01-01");
        assert_eq!(
            all.top_paths,
            vec![
                PathCount {
                    path: "/a".into(),
                    requests: 2
                },
                PathCount {
                    path: "/b".into(),
                    requests: 1
                }
            ]
        );
        let one = merge_stats(vec![m.stats(&StatsQuery {
            since_ms: 0,
            key_prefix: Some("pgk_a".into()),
            exclude_gateway: false,
        })]);
        assert_eq!((one.p50_ms, one.p95_ms), (Some(5), Some(7)));
        assert_eq!(one.error_share, 0.5);
    }

    /// Roll-up stats equal a scan of the rows (the old D1 queries'
    /// arithmetic), over several shards.
    #[test]
    fn stats_from_rollups_equal_a_scan() {
        let mut shards = [Mem::default(), Mem::default(), Mem::default()];
        let mut all = Vec::new();
        let mut x: u64 = 7;
        for i in 0..600u64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let status = [200, 201, 404, 500, 503][(x >> 33) as usize % 5];
            let path = ["/a", "/b", "/c"][(x >> 40) as usize % 3];
            let r = row(
                &format!("r{i}"),
                i * 500_000,
                path,
                status,
                (x >> 50) % 300,
                None,
            );
            all.push(r.clone());
            ingest(&mut shards[i as usize % 3], &[r]).ok();
        }
        let q = StatsQuery {
            since_ms: 0,
            key_prefix: None,
            exclude_gateway: false,
        };
        let s = merge_stats(shards.iter().map(|m| m.stats(&q)).collect());
        let mut ms: Vec<u64> = all.iter().map(|r| r.response_time_ms).collect();
        ms.sort_unstable();
        let n = ms.len() as u64;
        let at = |q| ms[crate::audit::quantile_offset(n, q) as usize];
        assert_eq!(s.p50_ms, Some(at(0.5)));
        assert_eq!(s.p95_ms, Some(at(0.95)));
        assert_eq!(s.days.iter().map(|d| d.requests).sum::<u64>(), 600);
        let errs = all.iter().filter(|r| r.status >= 400).count();
        assert_eq!(s.error_share, errs as f64 / 600.0);
        let per_day = all.iter().filter(|r| r.time < DAY_MS).count() as u64;
        assert_eq!(s.days[0].requests, per_day);
        assert_eq!(s.days.len(), 4);
    }

    fn shard(p: &str, start: u64) -> Source {
        Source::Shard(Shard {
            project: p.into(),
            start_ms: start,
            end_ms: start + 10,
        })
    }

    #[test]
    fn plan_visits_bands_newest_first_within_bounds() {
        let sources = vec![
            shard("a", 0),
            shard("b", 20),
            shard("a", 20),
            shard("a", 10),
            Source::Legacy {
                start_ms: 0,
                end_ms: 15,
            },
        ];
        let all = Bounds {
            lo: 0,
            hi: u64::MAX,
            shards: true,
        };
        let bands = plan(sources.clone(), all);
        assert_eq!(
            bands.len(),
            2,
            "legacy overlaps the buckets 0 and 10: {bands:?}"
        );
        assert_eq!(bands[0].len(), 2);
        assert_eq!(bands[1].len(), 3);
        let q = AuditQuery {
            since: Some(12),
            until: Some(25),
            cursor: Some((19, "req_x".into())),
            ..AuditQuery::default()
        };
        let bands = plan(sources.clone(), Bounds::of(&q));
        assert_eq!(bands, vec![vec![shard("a", 10), sources[4].clone()]]);
        let empty = Bounds {
            lo: 30,
            hi: 5,
            shards: true,
        };
        assert!(plan(sources.clone(), empty).is_empty());
        let foreign = AuditQuery {
            request_id: Some("req_0b1e5c6a-0000-4000-8000-000000000000".into()),
            ..AuditQuery::default()
        };
        assert_eq!(
            plan(sources.clone(), Bounds::of(&foreign)),
            vec![vec![sources[4].clone()]],
            "an id the gateway did not make can only be a legacy row's"
        );
    }

    #[test]
    fn a_request_id_maps_to_its_bucket() {
        let id = crate::ids::request_id(1_700_000_000_123, 42);
        assert_eq!(request_id_time(&id), Some(1_700_000_000_123));
        assert_eq!(request_id_time("req_not-a-ulid"), None);
        let q = AuditQuery {
            request_id: Some(id),
            ..AuditQuery::default()
        };
        assert_eq!(
            Bounds::of(&q),
            Bounds {
                lo: 1_700_000_000_123,
                hi: 1_700_000_000_123,
                shards: true,
            }
        );
        let q = AuditQuery {
            request_id: Some("req_other".into()),
            status: Some(StatusFilter::Class(5)),
            ..AuditQuery::default()
        };
        assert_eq!(
            Bounds::of(&q),
            Bounds {
                lo: 0,
                hi: u64::MAX,
                shards: false,
            }
        );
    }

    #[test]
    fn fanout_is_bounded_and_merge_is_newest_first() {
        let wide: Vec<Source> = (0..=MAX_FANOUT)
            .map(|i| shard(&format!("p{i}"), 0))
            .collect();
        let bands = plan(
            wide,
            Bounds {
                lo: 0,
                hi: 100,
                shards: true,
            },
        );
        let e = check_fanout(&bands).err().map(|p| p.code);
        assert_eq!(e, Some(ErrorCode::AuditProjectRequired));
        assert!(check_fanout(&bands[..0]).is_ok());
        let m = merge(
            vec![
                vec![
                    row("b", 5, "/", 200, 1, None),
                    row("a", 1, "/", 200, 1, None),
                ],
                vec![
                    row("c", 5, "/", 200, 1, None),
                    row("d", 3, "/", 200, 1, None),
                ],
            ],
            3,
        );
        let ids: Vec<&str> = m.iter().map(|r| r.request_id.as_str()).collect();
        assert_eq!(ids, vec!["c", "b", "d"]);
    }

    #[test]
    fn gateway_calls_are_left_out_on_request_and_counted_by_endpoint() {
        let mut m = Mem::default();
        let lookup = |i: u32| format!("/_postguard/v1/idempotency/order-{i}");
        let mut batch = vec![
            row("p1", HOUR_MS, "/orders", 200, 10, Some("pgk_a")),
            row("p2", HOUR_MS + 1, "/orders", 503, 30, Some("pgk_a")),
        ];
        for i in 0..3u32 {
            batch.push(row(
                &format!("g{i}"),
                HOUR_MS + 2,
                &lookup(i),
                200,
                900,
                Some("pgk_a"),
            ));
        }
        batch.push(row(
            "s1",
            HOUR_MS + 3,
            "/_postguard/v1/stats",
            200,
            700,
            Some("pgk_a"),
        ));
        let done = ingest(&mut m, &batch).unwrap();
        assert_eq!(
            done.rollups
                .latency_gateway
                .iter()
                .map(|l| l.n)
                .sum::<u64>(),
            4
        );
        let q = |exclude_gateway| StatsQuery {
            since_ms: 0,
            key_prefix: None,
            exclude_gateway,
        };
        let all = merge_stats(vec![m.stats(&q(false))]);
        assert_eq!(all.days[0].requests, 6);
        assert_eq!(
            all.top_paths[0],
            PathCount {
                path: "/_postguard/v1/idempotency/{key}".into(),
                requests: 3
            },
            "one endpoint, not three URLs"
        );
        assert_eq!(all.p95_ms, Some(900));
        let api = merge_stats(vec![m.stats(&q(true))]);
        assert_eq!(api.days[0].requests, 2);
        assert_eq!((api.days[0].errors, api.error_share), (1, 0.5));
        assert_eq!(
            api.top_paths,
            vec![PathCount {
                path: "/orders".into(),
                requests: 2
            }]
        );
        assert_eq!(
            (api.p50_ms, api.p95_ms),
            (Some(10), Some(30)),
            "the gateway's latencies are subtracted"
        );
        // The cross-project roll-up shard gets the same split.
        let mut total = Mem::default();
        total.add(&Rollups::sum(vec![done.rollups])).unwrap();
        assert_eq!(merge_stats(vec![total.stats(&q(true))]), api);
    }

    #[test]
    fn key_activity_adds_shards_up_and_puts_the_latest_use_first() {
        let k = |p: &str, r, e, at| KeyActivity {
            key_prefix: p.into(),
            requests: r,
            errors: e,
            last_used_at: at,
        };
        let day1 = vec![k("pgk_a", 3, 1, 100), k("pgk_b", 1, 0, 150)];
        let day2 = vec![k("pgk_a", 2, 0, 900)];
        assert_eq!(
            merge_key_activity(vec![day1, day2]),
            vec![k("pgk_a", 5, 1, 900), k("pgk_b", 1, 0, 150)]
        );
        assert!(merge_key_activity(vec![]).is_empty());
    }
}
