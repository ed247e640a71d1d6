//! The audit log in shards: one SQLite Durable Object per (project, time
//! bucket), found through a small directory in D1 (ADR 0016).
//!
//! Everything decided about shards is here: which shard a row goes to and
//! its name, which shards a query visits and in which order, merging their
//! answers newest first, the hourly roll-ups a batch adds (only for rows it
//! really inserted, so a retried batch never counts twice), and `/stats`
//! arithmetic (days, top paths, exact percentiles from latency counts). The
//! object (`src/durable/audit_shard/`) is a thin class over [`ShardStore`]
//! answering the typed operations of [`protocol`].
//!
//! - this file: which shard holds a row, which shards a query visits,
//!   merging their rows, and a batch's ingest over [`ShardStore`];
//! - [`rollups`]: the hourly counts a batch adds;
//! - [`stats`]: `/stats` and `/keys/activity` from those counts;
//! - [`usage`]: `/usage` (what is billable) from those counts;
//! - [`protocol`]: the operations the object takes, typed.

pub mod protocol;
mod rollups;
mod stats;
mod tally;
#[cfg(test)]
mod tests;
pub mod usage;

pub use rollups::*;
pub use stats::*;

use std::collections::HashSet;

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
// The bucket's bounds are the configuration's (`audit.bucket_ms`).
pub use crate::config::{DEFAULT_BUCKET_MS, MAX_BUCKET_MS, MIN_BUCKET_MS};
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
