//! The `webhooks` section of `POSTGUARD_CONFIG`, beside the decisions it
//! configures: delivery schedule and timeouts, the daily quotas and storage
//! marks, inspectors' capture limits, URL rules for development, what a
//! revoked key does to its subscriptions — and the section's validation.
//!
//! `config` re-exports it (`config::WebhooksConfig`); it imports from
//! `config/` only the shared checks (`config/check.rs`), never
//! `config/mod.rs`, so the two folders import each other in no circle.

use serde::Deserialize;

use super::shard::{DEFAULT_BUCKET_MS, MAX_BUCKET_MS, MIN_BUCKET_MS};
use crate::config::check::{range, ConfigError};

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WebhooksConfig {
    pub schedule_s: Vec<u32>,
    pub timeout_ms: u32,
    pub max_payload_bytes: u32,
    pub allow_insecure_urls: bool,
    pub allow_hosts: Vec<String>,
    /// After `rotate-secret`, how long the old secret keeps signing (s).
    pub secret_overlap_s: u32,
    /// The daily job re-queues a delivery whose next attempt is this
    /// overdue (s): its message was lost (or never enqueued).
    pub requeue_after_s: u32,
    /// The every-minute sweep enqueues a published delivery whose first
    /// attempt is still unsent after this long (s): its publish's queue
    /// send failed and the origin did not retry.
    pub outbox_after_s: u32,
    /// A subscription whose every attempt failed for this long is disabled (s).
    pub disable_after_s: u32,
    /// Subscriptions one project may hold (the fan-out of one event).
    pub max_subscriptions_per_project: u32,
    /// What revoking an API key does to the subscriptions it created.
    pub on_key_revoked: OnKeyRevoked,
    /// Events one project may publish per UTC day (429 `EVENT_QUOTA_EXCEEDED`
    /// beyond; ADR 0017).
    pub events_per_project_per_day: u32,
    /// Deliveries one project's events may fan out to per UTC day.
    pub deliveries_per_project_per_day: u32,
    /// Bytes one project's webhook records may take in D1 per UTC day, as
    /// charged by `webhooks::capacity::event_bytes`: with the retention and
    /// the high-water mark, this is the capacity proof (docs/capacity.md).
    pub bytes_per_project_per_day: u64,
    /// Manual retries and redirects per delivery (409 `RETRY_LIMIT_REACHED`
    /// beyond), on top of the automatic schedule.
    pub manual_attempts_per_delivery: u32,
    /// D1's size (bytes) at which publishing is refused with 503
    /// `STORAGE_FULL` until retention frees space. D1 holds at most 10 GB;
    /// it keeps the shard directory and the subscriptions (ADR 0035).
    pub d1_high_water_bytes: u64,
    /// The time span of one webhook shard (ms; default one UTC day, ADR 0035).
    pub shard_bucket_ms: u64,
    /// A shard's size (bytes) at which its project's publishes are refused
    /// with 503 `STORAGE_FULL` (a Durable Object holds at most 10 GB).
    pub shard_high_water_bytes: u64,
    /// What one inspector's capture URL accepts from its (unauthenticated)
    /// senders: captures and bytes per minute and per UTC day. Over it the
    /// sender gets 429; the project's own quotas are never touched.
    pub inspector_captures_per_minute: u32,
    pub inspector_bytes_per_minute: u64,
    pub inspector_captures_per_day: u32,
    pub inspector_bytes_per_day: u64,
}

/// What becomes of a revoked key's subscriptions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnKeyRevoked {
    /// Kept, but nothing is delivered to them (ADR 0015).
    Pause,
    /// Deleted with their pending deliveries.
    Delete,
}

impl Default for WebhooksConfig {
    fn default() -> Self {
        WebhooksConfig {
            schedule_s: vec![60, 900, 3_600, 86_400],
            timeout_ms: 30_000,
            max_payload_bytes: 65_536,
            allow_insecure_urls: false,
            allow_hosts: Vec::new(),
            secret_overlap_s: 86_400,
            requeue_after_s: 900,
            outbox_after_s: 60,
            disable_after_s: 432_000,
            max_subscriptions_per_project: 200,
            on_key_revoked: OnKeyRevoked::Pause,
            events_per_project_per_day: 1_000_000,
            deliveries_per_project_per_day: 5_000_000,
            bytes_per_project_per_day: 8 << 30,
            manual_attempts_per_delivery: 5,
            d1_high_water_bytes: 8_000_000_000,
            shard_bucket_ms: DEFAULT_BUCKET_MS,
            shard_high_water_bytes: 9_000_000_000,
            inspector_captures_per_minute: 60,
            inspector_bytes_per_minute: 1 << 20,
            inspector_captures_per_day: 2_000,
            inspector_bytes_per_day: 16 << 20,
        }
    }
}

/// One publish writes one delivery row per matching subscription in a single
/// D1 batch; beyond this the batch and the fan-out get too large.
pub const MAX_SUBSCRIPTIONS_CAP: u32 = 5_000;
/// One D1 database's largest size (bytes).
pub const D1_MAX_BYTES: u64 = 10_000_000_000;
/// What one SQLite-backed Durable Object holds at most (a webhook shard).
pub const DO_MAX_BYTES: u64 = 10_000_000_000;

/// Checks the section, each field in the order `config::validate` always
/// checked them (the first error named stays the same).
pub fn validate(wh: &WebhooksConfig) -> Result<(), ConfigError> {
    validate_delivery(wh)?;
    validate_capacity(wh)?;
    validate_inspectors(wh)?;
    validate_allow_hosts(wh)
}

/// How deliveries are attempted: the retry schedule, timeouts and delays.
fn validate_delivery(wh: &WebhooksConfig) -> Result<(), ConfigError> {
    if wh.schedule_s.is_empty() || wh.schedule_s.len() > 20 {
        return Err(ConfigError::new(
            "webhooks.schedule_s",
            "must list 1 to 20 delays",
        ));
    }
    for (i, d) in wh.schedule_s.iter().enumerate() {
        range(format!("webhooks.schedule_s[{i}]"), *d, 1, 7 * 86_400)?;
    }
    range("webhooks.timeout_ms", wh.timeout_ms, 100, 600_000)?;
    range(
        "webhooks.secret_overlap_s",
        wh.secret_overlap_s,
        1,
        30 * 86_400,
    )?;
    range(
        "webhooks.requeue_after_s",
        wh.requeue_after_s,
        1,
        7 * 86_400,
    )?;
    range("webhooks.outbox_after_s", wh.outbox_after_s, 0, 3_600)?;
    range(
        "webhooks.disable_after_s",
        wh.disable_after_s,
        1,
        90 * 86_400,
    )
}

/// The quotas and storage marks that bound what one project costs.
fn validate_capacity(wh: &WebhooksConfig) -> Result<(), ConfigError> {
    range(
        "webhooks.max_subscriptions_per_project",
        wh.max_subscriptions_per_project,
        1,
        MAX_SUBSCRIPTIONS_CAP,
    )?;
    range(
        "webhooks.max_payload_bytes",
        wh.max_payload_bytes,
        1_024,
        1 << 20,
    )?;
    range(
        "webhooks.events_per_project_per_day",
        wh.events_per_project_per_day,
        1,
        100_000_000,
    )?;
    range(
        "webhooks.deliveries_per_project_per_day",
        wh.deliveries_per_project_per_day,
        1,
        1_000_000_000,
    )?;
    range(
        "webhooks.bytes_per_project_per_day",
        wh.bytes_per_project_per_day,
        1,
        DO_MAX_BYTES,
    )?;
    range(
        "webhooks.manual_attempts_per_delivery",
        wh.manual_attempts_per_delivery,
        0,
        100,
    )?;
    range(
        "webhooks.d1_high_water_bytes",
        wh.d1_high_water_bytes,
        1,
        D1_MAX_BYTES,
    )?;
    range(
        "webhooks.shard_bucket_ms",
        wh.shard_bucket_ms,
        MIN_BUCKET_MS,
        MAX_BUCKET_MS,
    )?;
    range(
        "webhooks.shard_high_water_bytes",
        wh.shard_high_water_bytes,
        1,
        D1_MAX_BYTES,
    )
}

/// What one inspector's capture URL accepts: a day's allowance at least a
/// minute's.
fn validate_inspectors(wh: &WebhooksConfig) -> Result<(), ConfigError> {
    range(
        "webhooks.inspector_captures_per_minute",
        wh.inspector_captures_per_minute,
        1,
        100_000,
    )?;
    range(
        "webhooks.inspector_bytes_per_minute",
        wh.inspector_bytes_per_minute,
        1_024,
        1 << 30,
    )?;
    range(
        "webhooks.inspector_captures_per_day",
        wh.inspector_captures_per_day,
        wh.inspector_captures_per_minute,
        10_000_000,
    )?;
    range(
        "webhooks.inspector_bytes_per_day",
        wh.inspector_bytes_per_day,
        wh.inspector_bytes_per_minute,
        1 << 36,
    )
}

/// `allow_hosts` (development): host names or IP literals, visible ASCII.
fn validate_allow_hosts(wh: &WebhooksConfig) -> Result<(), ConfigError> {
    for (i, host) in wh.allow_hosts.iter().enumerate() {
        if host.is_empty() || host.len() > 253 || !host.bytes().all(|b| (0x21..0x7f).contains(&b)) {
            return Err(ConfigError::new(
                format!("webhooks.allow_hosts[{i}]"),
                "must be a host name or IP literal",
            ));
        }
    }
    Ok(())
}
