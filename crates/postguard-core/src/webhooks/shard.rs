//! Where a webhook record lives (ADR 0035): one `WebhookShard` object per
//! (project, time bucket of the event), named by [`ShardKey::name`]. An id
//! the gateway issues for a delivery carries its bucket: the ULID's time
//! field is the bucket's start ([`delivery_id`]), so with the project (which
//! every caller has: the API key's, or the queue message's) it names its
//! shard without a lookup. D1 keeps the directory of shards that exist
//! (`webhook_shards`), for listing and retention.
//!
//! Pure: the shell passes the clock, the random bits and the bucket length.

use serde::{Deserialize, Serialize};

pub const DAY_MS: u64 = 86_400_000;
/// Default bucket: one UTC day, so a shard's daily counters are the
/// project's (the quota is per project per UTC day).
pub const DEFAULT_BUCKET_MS: u64 = DAY_MS;
/// Bounds of `webhooks.shard_bucket_ms` (tests use seconds).
pub const MIN_BUCKET_MS: u64 = 1_000;
pub const MAX_BUCKET_MS: u64 = 31 * DAY_MS;

/// One shard: a project's records of the events published in
/// `[start_ms, start_ms + bucket)`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ShardKey {
    pub project: String,
    pub start_ms: u64,
}

impl ShardKey {
    /// The shard of `project`'s events published at `time`.
    pub fn of(project: &str, time: u64, bucket_ms: u64) -> ShardKey {
        let bucket = bucket_ms.clamp(MIN_BUCKET_MS, MAX_BUCKET_MS);
        ShardKey {
            project: project.to_string(),
            start_ms: time - time % bucket,
        }
    }

    /// The object's name (`idFromName`): distinct from the audit shards'.
    pub fn name(&self) -> String {
        format!("wh/{}/{}", self.project, self.start_ms)
    }

    /// The shard a gateway-issued delivery id of `project` names.
    pub fn of_delivery(project: &str, delivery_id: &str) -> Option<ShardKey> {
        id_time(delivery_id).map(|start_ms| ShardKey {
            project: project.to_string(),
            start_ms,
        })
    }
}

/// The time field of a prefixed ULID (`dlv_…`, `evt_…`), if it is one.
pub fn id_time(id: &str) -> Option<u64> {
    let (_, ulid) = id.split_once('_')?;
    ulid::Ulid::from_string(ulid).ok().map(|u| u.timestamp_ms())
}

/// A delivery id of shard `shard`: `dlv_` + a ULID whose time is the
/// shard's start. Ids of one shard sort by their random part; the log
/// orders by `(created_at, id)`, never by the id alone.
pub fn delivery_id(shard: &ShardKey, random: u128) -> String {
    crate::ids::prefixed("dlv_", shard.start_ms, random)
}

/// Directory rows that may hold rows of `[since, until]`, in the order a
/// newest-first (`desc`) or oldest-first page visits them.
pub fn visit_order(
    mut shards: Vec<(u64, u64)>,
    since: Option<u64>,
    until: Option<u64>,
    desc: bool,
) -> Vec<(u64, u64)> {
    shards
        .retain(|(start, end)| since.is_none_or(|s| *end > s) && until.is_none_or(|u| *start <= u));
    shards.sort_unstable();
    shards.dedup();
    if desc {
        shards.reverse();
    }
    shards
}

/// Merges the rows read so far from the shards visited (each sorted) into
/// one page order, and says whether the page is complete: it has `take`
/// rows and the next shard to visit (`next`, its `(start, end)`) cannot hold
/// a row that sorts before the last of them. `key` gives a row's
/// `(created_at, id)`.
pub fn page_complete<T>(
    rows: &mut Vec<T>,
    take: usize,
    next: Option<(u64, u64)>,
    desc: bool,
    key: impl Fn(&T) -> (u64, String),
) -> bool {
    rows.sort_by(|a, b| {
        let (ka, kb) = (key(a), key(b));
        if desc {
            kb.cmp(&ka)
        } else {
            ka.cmp(&kb)
        }
    });
    if rows.len() < take {
        return next.is_none();
    }
    rows.truncate(take);
    let Some((start, end)) = next else {
        return true;
    };
    let (last, _) = key(&rows[take - 1]);
    // Rows of the next shard are created within [start, end).
    if desc {
        end <= last
    } else {
        start > last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivery_id_names_its_shard() {
        let k = ShardKey::of("acme", 1_700_000_123_456, DAY_MS);
        assert_eq!(k.start_ms % DAY_MS, 0);
        let id = delivery_id(&k, 42);
        assert!(id.starts_with("dlv_"));
        assert_eq!(ShardKey::of_delivery("acme", &id), Some(k));
        assert_eq!(ShardKey::of_delivery("acme", "dlv_nope"), None);
    }

    #[test]
    fn visiting_order_and_completion() {
        let shards = vec![(0, 10), (20, 30), (10, 20)];
        assert_eq!(
            visit_order(shards.clone(), None, None, true),
            vec![(20, 30), (10, 20), (0, 10)]
        );
        assert_eq!(
            visit_order(shards, Some(15), Some(25), false),
            vec![(10, 20), (20, 30)]
        );
        let mut rows = vec![(25u64, "b".to_string()), (28, "a".to_string())];
        let key = |r: &(u64, String)| r.clone();
        assert!(!page_complete(&mut rows, 3, Some((10, 20)), true, key));
        assert!(page_complete(&mut rows, 2, Some((10, 20)), true, key));
        assert_eq!(rows[0].0, 28);
        // An overlapping next shard may still hold newer rows.
        assert!(!page_complete(&mut rows, 2, Some((20, 26)), true, key));
    }
}
