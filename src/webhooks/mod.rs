//! Outbound webhooks (docs/webhooks.md): subscriptions, publishing with fan-out,
//! delivery through the `DELIVERIES` queue, the delivery log and its retry and
//! redirect. Decisions (URL rules, signatures, outcome and schedule, payload)
//! are in `postguard_core::webhooks`; this module does the I/O.
//!
//! Storage is D1 (`migrations/0002_webhooks.sql`). Every delivery attempt is
//! one queue message ([`Job`]); a retry is a new message sent with a delay, so
//! delays beyond the queue's 12 h maximum are chained through `not_before`.

pub mod consumer;
pub mod deliveries;
pub mod directory;
pub mod feed;
pub mod group;
pub mod health;
pub mod inspectors;
pub mod ops;
pub mod publish;
pub mod requeue;
pub mod retention;
pub mod sender;
pub mod shards;
pub mod subscriptions;
pub mod tasks;
pub mod usage;
pub mod write;

use postguard_core::config::Config;
use postguard_core::ids;
use postguard_core::webhooks::url_guard::UrlPolicy;
use serde::{Deserialize, Serialize};

pub use crate::d1::{num, text};

/// One delivery attempt to make (the wire form of
/// `postguard_core::webhooks::delivery::Job`). Attempts are numbered when
/// they run: the consumer claims `attempts_made + 1` with a compare-and-set
/// before sending (ADR 0009), so manual retries and redirects continue the
/// count without colliding with scheduled ones.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    pub delivery_id: String,
    /// The delivery's project and subscription: with the id, they name its
    /// shard and its receiver without a lookup (ADR 0035). Absent in the
    /// messages of the deployment before the shards (legacy D1 rows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subscription_id: Option<String>,
    /// The planned time of a scheduled attempt (epoch ms). It is the job's
    /// identity: a scheduled job runs only while it equals the delivery's
    /// `next_attempt_at`, so a superseded job (after a manual retry took over
    /// the schedule, or a duplicate message) is dropped. A job that arrives
    /// well before it waits another hop (delays past the queue's 12 h limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before: Option<u64>,
    /// Send once to this URL instead (redirect); leaves status and schedule alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirect_url: Option<String>,
    /// A manual retry: runs whatever the delivery's status, but `delivered`.
    #[serde(default)]
    pub manual: bool,
    /// Released by resume: sent one after another with the other released
    /// jobs of its subscription in the same batch (creation order).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ordered: bool,
    /// The throttle slot (epoch ms) reserved for this job; it is sent at it
    /// without reserving again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<u64>,
}

/// A message of the delivery queue (or its dead-letter queue).
pub type Msg = worker::Message<serde_json::Value>;

/// A step of a background task (bulk recover), on the same queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskStep {
    pub task_id: String,
}

impl Job {
    /// The scheduled attempt of a stored delivery of `project`.
    pub fn first(project: &str, j: &postguard_core::webhooks::records::FirstJob) -> Job {
        Job {
            project: Some(project.to_string()),
            subscription_id: Some(j.subscription_id.clone()),
            ..Job::scheduled(j.delivery_id.clone(), j.at)
        }
    }

    pub fn scheduled(delivery_id: String, at: u64) -> Job {
        Job {
            delivery_id,
            project: None,
            subscription_id: None,
            not_before: Some(at),
            redirect_url: None,
            manual: false,
            ordered: false,
            slot: None,
        }
    }

    pub fn manual(delivery_id: String, redirect_url: Option<String>) -> Job {
        Job {
            delivery_id,
            project: None,
            subscription_id: None,
            not_before: None,
            redirect_url,
            manual: true,
            ordered: false,
            slot: None,
        }
    }
}

pub fn policy(cfg: &Config) -> UrlPolicy<'_> {
    UrlPolicy {
        allow_insecure: cfg.settings.webhooks.allow_insecure_urls,
        allow_hosts: &cfg.settings.webhooks.allow_hosts,
    }
}

/// A JSON array bound as one parameter of a multi-row statement
/// (`json_each(?)`): one statement for any number of rows, within D1's limit
/// of 100 bound parameters.
pub fn to_json<T: Serialize + ?Sized>(rows: &T) -> worker::Result<String> {
    serde_json::to_string(rows).map_err(|e| worker::Error::RustError(e.to_string()))
}

/// `prefix` + a ULID of now.
pub fn new_id(prefix: &str) -> String {
    let (now, rnd) = crate::runtime::new_ulid_parts();
    ids::prefixed(prefix, now, rnd)
}

/// Sends `jobs` to the delivery queue in chunks within `sendBatch`'s limits
/// (100 messages, 256 KB): a fan-out or a re-queue of any size goes out.
pub async fn enqueue(env: &worker::Env, jobs: Vec<Job>) -> worker::Result<()> {
    let queue = env.queue(crate::bindings::DELIVERIES)?;
    let now = crate::runtime::now_ms();
    for range in batches(&jobs) {
        queue.send_batch(messages(&jobs[range], now)).await?;
    }
    Ok(())
}

/// `jobs` as queue messages at `now`: a scheduled job planned for later (a
/// scheduled event's `deliver_at`) is delayed by the whole wait up to the
/// queue's maximum ([`schedule::first_hop_s`]); what is left is chained by
/// the consumer (the job arrives early and waits another hop).
///
/// [`schedule::first_hop_s`]: postguard_core::webhooks::schedule::first_hop_s
pub fn messages(jobs: &[Job], now: u64) -> Vec<worker::SendMessage<Job>> {
    jobs.iter()
        .map(|j| {
            let delay = j.not_before.map_or(0, |at| {
                postguard_core::webhooks::schedule::first_hop_s(at, now)
            });
            let m = worker::MessageBuilder::new(j.clone());
            match u32::try_from(delay) {
                Ok(0) => m.build(),
                Ok(d) => m.delay_seconds(d).build(),
                Err(_) => m.delay_seconds(u32::MAX).build(),
            }
        })
        .collect()
}

/// The ranges of `jobs` that each fit one `sendBatch` (the core decides).
pub fn batches(jobs: &[Job]) -> Vec<std::ops::Range<usize>> {
    let sizes: Vec<usize> = jobs
        .iter()
        .map(|j| serde_json::to_vec(j).map_or(0, |b| b.len()))
        .collect();
    postguard_core::webhooks::fanout::chunks(&sizes)
}
