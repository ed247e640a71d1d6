//! The operations an audit shard takes: each one path, one JSON request and
//! one JSON answer, typed here so the object and its callers cannot
//! disagree (the object answers with JSON SQLite built; [`answer`] reads
//! it as the operation's type). The calls themselves stay one function
//! over bytes in the shell, so the wasm holds one join type for every
//! fan-out (ADR 0026).

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::rollups::Rollups;
use super::stats::{KeyActivity, ShardStats, StatsQuery};
use super::usage::UsageDelta;
use super::usage::UsageQuery;
use super::Ingested;
use crate::audit::{AuditQuery, AuditRow};

/// One operation of the audit shard.
pub trait Operation {
    const PATH: &'static str;
    type Request: Serialize + DeserializeOwned;
    type Response: Serialize + DeserializeOwned;
}

/// The request of `O`, as the call carries it.
pub fn request<O: Operation>(r: &O::Request) -> Result<Vec<u8>, serde_json::Error> {
    serde_json::to_vec(r)
}

/// The answer of `O`, read from what the object sent.
pub fn answer<O: Operation>(bytes: &[u8]) -> Result<O::Response, serde_json::Error> {
    serde_json::from_slice(bytes)
}

/// An answer with nothing in it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Done {}

/// `Query`: the audit query and how many rows to return at most.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardQuery {
    pub q: AuditQuery,
    pub take: u32,
}

/// `Page`: rows with `since <= time < until` after `after`, oldest first
/// (the archive).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PageQuery {
    pub since: u64,
    pub until: u64,
    pub after: (u64, String),
    pub take: u32,
}

/// `Keys`: each key's activity from this hour (ms) on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeysQuery {
    pub since_ms: u64,
}

/// `Size`'s answer: the object's database size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SizeReply {
    pub bytes: u64,
}

/// Stores a batch and its roll-ups (rows already stored count nowhere).
pub struct Ingest;
/// Adds roll-up counts alone (the cross-project shard of a bucket).
pub struct Add;
/// The rows an audit query matches, newest first.
pub struct Query;
/// Rows of a time window, oldest first, after a cursor.
pub struct Page;
/// The roll-ups `/stats` reads.
pub struct Stats;
/// Each key's requests, errors and last use (`GET /keys/activity`).
pub struct Keys;
/// The usage sums `/usage` reads.
pub struct Usage;
/// Deletes everything (retention drops whole buckets).
pub struct Drop;
/// The object's database size.
pub struct Size;

macro_rules! operation {
    ($op:ident, $path:literal, $req:ty => $resp:ty) => {
        impl Operation for $op {
            const PATH: &'static str = $path;
            type Request = $req;
            type Response = $resp;
        }
    };
}

operation!(Ingest, "/ingest", Vec<AuditRow> => Ingested);
operation!(Add, "/add", Rollups => Done);
operation!(Query, "/query", ShardQuery => Vec<AuditRow>);
operation!(Page, "/page", PageQuery => Vec<AuditRow>);
operation!(Stats, "/stats", StatsQuery => ShardStats);
operation!(Keys, "/keys", KeysQuery => Vec<KeyActivity>);
operation!(Usage, "/usage", UsageQuery => Vec<UsageDelta>);
operation!(Drop, "/drop", Done => Done);
operation!(Size, "/size", Done => SizeReply);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_read_what_the_object_writes() {
        // What SQLite's json_object builds for an empty shard's stats and usage.
        let stats = answer::<Stats>(br#"{"hours":[],"paths":[],"latency":[],"missing":[]}"#);
        assert_eq!(stats.ok(), Some(ShardStats::default()));
        let old = answer::<Stats>(br#"{"hours":[],"paths":[],"latency":[]}"#);
        assert!(
            old.is_ok(),
            "a shard without the usage table answers without `missing`"
        );
        assert_eq!(answer::<Usage>(b"[]").ok(), Some(Vec::new()));
        assert_eq!(answer::<Drop>(b"{}").ok(), Some(Done {}));
        assert!(answer::<Size>(b"{}").is_err());
        let paths = [
            Ingest::PATH,
            Add::PATH,
            Query::PATH,
            Page::PATH,
            Stats::PATH,
            Keys::PATH,
            Usage::PATH,
            Drop::PATH,
            Size::PATH,
        ];
        let mut unique = paths.to_vec();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), paths.len(), "one path per operation");
    }
}
