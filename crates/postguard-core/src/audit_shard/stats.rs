//! `/stats` and `/keys/activity` from the shards' roll-ups: days, top paths,
//! exact percentiles from latency counts, the requests that lacked a
//! required Idempotency-Key, and each key's last use.

use serde::{Deserialize, Serialize};

use super::tally::Tally;
use super::DAY_MS;

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
    /// Proxied requests without a required Idempotency-Key, per hour and
    /// key (a shard from before 0.4 has none).
    #[serde(default)]
    pub missing: Vec<MissingCount>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MissingCount {
    pub hour: u64,
    pub key_prefix: String,
    pub requests: u64,
}

/// A key and how many requests it sent without a required Idempotency-Key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyCount {
    pub key_prefix: String,
    pub requests: u64,
}

/// The most keys `keys_missing_idempotency` lists.
pub const MAX_KEYS_LISTED: usize = 50;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Day {
    pub date: String,
    pub requests: u64,
    pub errors: u64,
    pub server_errors: u64,
    /// Requests forwarded without an Idempotency-Key where one is required
    /// (before `idempotency.required_from`) or refused for it (after).
    pub missing_idempotency_key: u64,
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
    /// Who sent requests without a required Idempotency-Key in the period,
    /// largest first (at most [`MAX_KEYS_LISTED`]): whom to tell.
    pub keys_missing_idempotency: Vec<KeyCount>,
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
    let mut missing = Tally::default();
    let none = String::new;
    for p in parts {
        for m in p.missing {
            let day = m.hour / DAY_MS * DAY_MS;
            // Column 3 of a day: its missing keys (0–2 are the hour counts).
            days.add((day, none(), none(), 0), &[0, 0, 0, m.requests]);
            missing.add((0, m.key_prefix, none(), 0), &[m.requests]);
        }
        for h in p.hours {
            let day = h.hour / DAY_MS * DAY_MS;
            let counts = [h.requests, h.errors, h.server_errors];
            days.add((day, none(), none(), 0), &counts);
        }
        for c in p.paths {
            // An endpoint, not a URL: every idempotency lookup is one row.
            let path = match crate::routes::template_of(&c.path) {
                Some(t) => t.to_string(),
                None => c.path,
            };
            paths.add((0, path, none(), 0), &[c.requests]);
        }
        for (ms, n) in p.latency {
            latency.add((ms, none(), none(), 0), &[n]);
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
            missing_idempotency_key: c[3],
        })
        .collect();
    let mut keys_missing: Vec<KeyCount> = missing
        .0
        .into_iter()
        .map(|((_, key_prefix, ..), c)| KeyCount {
            key_prefix,
            requests: c[0],
        })
        .collect();
    keys_missing.sort_by(|a, b| {
        b.requests
            .cmp(&a.requests)
            .then_with(|| a.key_prefix.cmp(&b.key_prefix))
    });
    keys_missing.truncate(MAX_KEYS_LISTED);
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
        keys_missing_idempotency: keys_missing,
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
