//! The operations a webhook shard takes (ADR 0035): each one path, one
//! JSON request and one JSON answer, typed here so the object and its
//! callers cannot disagree. The object runs each through a function of
//! [`super::records`] inside one transaction; the shell calls them by type
//! (`durable::webhook_shard::call::<O>`), never by a string path.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::capacity::Usage;
use super::health::Tally;
use super::ordering::PredView;
use super::records::{
    Archived, AttemptRecord, ClaimJob, Claimed, DeliveryQuery, DeliveryRecord, Detail, EventQuery,
    EventRecord, FeedRow, FirstJob, Imported, Limits, Manual, NewEvent, RecoverStep, Recovered,
    Restore, Stored,
};

/// One operation of the webhook shard.
pub trait Operation {
    const PATH: &'static str;
    type Request: Serialize + DeserializeOwned;
    type Response: Serialize + DeserializeOwned;
}

/// A request or an answer with nothing in it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Done {}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishReq {
    /// Delivery ids sent to the queue since this isolate's last call (their
    /// outbox marks ride in this transaction).
    pub sent: Vec<String>,
    pub events: Vec<NewEvent>,
    pub limits: Limits,
    pub now: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdsReq {
    pub ids: Vec<String>,
    pub now: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BeforeReq {
    pub before: u64,
    pub limit: u32,
    pub now: u64,
    /// `Requeue`: day counters before this UTC day go (retention).
    #[serde(default)]
    pub oldest_day: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimReq {
    pub jobs: Vec<ClaimJob>,
    pub now: u64,
    /// How long a claimed scheduled attempt is in flight (a worker of an
    /// earlier build sends none: then no attempt is marked in flight).
    #[serde(default)]
    pub lease_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SettleReq {
    pub attempts: Vec<super::records::Settle>,
    pub schedule: Vec<u32>,
    pub now: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseReq {
    pub subscription_id: String,
    pub limit: u32,
    pub now: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManualReq {
    pub delivery_id: String,
    pub max: u32,
    pub now: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoverReq {
    pub step: RecoverStep,
    pub now: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CountReq {
    pub subscription_id: String,
    pub since: u64,
    pub until: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DetailReq {
    pub delivery_id: String,
}

/// `Unclaim`: attempt `attempt` of the delivery was claimed, not sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnclaimReq {
    pub delivery_id: String,
    pub attempt: u32,
    pub now: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListReq {
    pub q: DeliveryQuery,
    pub take: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FeedReq {
    pub q: EventQuery,
    pub take: u32,
}

/// `Archive`: deliveries created in `[since, until)` after `after`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArchiveReq {
    pub since: u64,
    pub until: u64,
    pub after: (u64, String),
    pub take: u32,
}

/// `Health`: the attempts at or after `since` of these subscriptions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthReq {
    pub subscription_ids: Vec<String>,
    pub since: u64,
}

/// `Vitals`' answer: the shard's size and its oldest due delivery.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Vitals {
    pub bytes: u64,
    pub oldest_due: Option<(u64, String)>,
}

/// `Size`'s answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SizeReply {
    pub bytes: u64,
}

/// Everything a shard holds (tests, and an operator's export).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dump {
    pub events: Vec<EventRecord>,
    pub deliveries: Vec<DeliveryRecord>,
    pub attempts: Vec<AttemptRecord>,
    pub usage: Vec<DayUsage>,
    pub bytes: u64,
}

/// One UTC day's counters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DayUsage {
    pub day: u64,
    pub events: u64,
    pub deliveries: u64,
    pub bytes: u64,
}

impl DayUsage {
    pub fn of(day: u64, u: &Usage) -> DayUsage {
        DayUsage {
            day,
            events: u.events,
            deliveries: u.deliveries,
            bytes: u.bytes,
        }
    }
}

/// What a settle came to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SettleReply {
    /// `(at, delay_s)` of each attempt's next job.
    pub follow_ups: Vec<Option<(u64, u64)>>,
    /// First jobs of deliveries whose lane predecessor just settled.
    #[serde(default)]
    pub wakes: Vec<FirstJob>,
}

macro_rules! operations {
    ($($(#[$doc:meta])* $op:ident, $path:literal, $req:ty => $resp:ty;)*) => {
        $(
            $(#[$doc])*
            pub struct $op;
            impl Operation for $op {
                const PATH: &'static str = $path;
                type Request = $req;
                type Response = $resp;
            }
        )*
        /// Every operation's path (one each).
        #[allow(dead_code)]
        pub const PATHS: &[&str] = &[$($path),*];
    };
}

pub(crate) use operations;

operations! {
    /// Store a batch of events and their deliveries, within the limits.
    Publish, "/publish", PublishReq => Vec<Stored>;
    /// Mark deliveries handed to the queue (the outbox forgets them).
    MarkSent, "/mark-sent", IdsReq => Done;
    /// The outbox: first jobs not handed to the queue before `before`.
    Unsent, "/unsent", BeforeReq => Vec<FirstJob>;
    /// Claim the attempts the queue's jobs ask for (compare-and-set each).
    ClaimAttempts, "/claim", ClaimReq => Vec<Claimed>;
    /// Record attempts and their follow-ups, and wake the lanes' next.
    SettleAttempts, "/settle", SettleReq => SettleReply;
    /// Deliveries as a successor's gate sees them (ordering keys).
    Peek, "/peek", IdsReq => Vec<Option<PredView>>;
    /// Release a resumed subscription's held deliveries.
    Release, "/release", ReleaseReq => Vec<FirstJob>;
    /// Give back an attempt claimed and never sent.
    Unclaim, "/unclaim", UnclaimReq => bool;
    /// Claim a manual attempt (retry, redirect), within the limit.
    ManualAttempt, "/manual", ManualReq => Manual;
    /// One step of a recover task.
    Recover, "/recover", RecoverReq => Recovered;
    /// How many deliveries a recover would re-send.
    CountRecoverable, "/count-recoverable", CountReq => u64;
    /// Overdue deliveries handed to the queue again; old day counters dropped.
    Requeue, "/requeue", BeforeReq => Vec<FirstJob>;
    /// A delivery with its attempts and event.
    DetailOf, "/detail", DetailReq => Option<Detail>;
    /// A page of the delivery log.
    List, "/list", ListReq => Vec<DeliveryRecord>;
    /// A page of the event feed.
    Feed, "/feed", FeedReq => Vec<FeedRow>;
    /// Legacy rows moved in.
    Import, "/import", Vec<Imported> => u64;
    /// Records restored (an operator's repair).
    RestoreRecords, "/restore", Restore => u64;
    /// Everything the shard holds.
    DumpAll, "/dump", Done => Dump;
    /// Deletes everything (retention drops whole shards).
    Drop, "/drop", Done => Done;
    /// The shard's storage size.
    Size, "/size", Done => SizeReply;
    /// A page of deliveries for the archive.
    Archive, "/archive", ArchiveReq => Vec<Archived>;
    /// Attempts of the last 24 h per subscription (`webhooks::health`).
    Health, "/health", HealthReq => Vec<Tally>;
    /// Size and the oldest due delivery (the alerts' check).
    VitalsOf, "/vitals", Done => Vitals;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_path_per_operation() {
        let mut unique = PATHS.to_vec();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), PATHS.len());
        assert_eq!(PATHS.len(), 23);
    }
}
