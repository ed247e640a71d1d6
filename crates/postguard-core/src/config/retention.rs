//! What is kept, where and for how long: the `retention` section (days of
//! audit rows and delivery records), the `audit` section (whether a row is
//! recorded per request, and the span of an audit shard) and the `archive`
//! section (archived before retention deletes, and kept how long).

use serde::Deserialize;

use super::check::{range, ConfigError};
const DAY_MS: u64 = 86_400_000;
/// Default audit bucket: one UTC day (ADR 0016 has the numbers).
pub const DEFAULT_BUCKET_MS: u64 = DAY_MS;
/// The smallest and largest `audit.bucket_ms` accepted (tests use seconds).
pub const MIN_BUCKET_MS: u64 = 1_000;
pub const MAX_BUCKET_MS: u64 = 31 * DAY_MS;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionConfig {
    pub audit_days: u32,
    pub deliveries_days: u32,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig {
            audit_days: 90,
            deliveries_days: 14,
        }
    }
}

/// The compliance archive (ADR 0038).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ArchiveConfig {
    /// Before retention deletes audit rows or delivery records, write them
    /// to the `ARCHIVE` bucket; nothing is deleted that is not archived and
    /// verified. On by default: turning it off is the operator's choice.
    pub enabled: bool,
    /// Days an archive object is kept (the daily job deletes older ones).
    pub keep_days: u32,
}

impl Default for ArchiveConfig {
    fn default() -> Self {
        ArchiveConfig {
            enabled: true,
            keep_days: 2_557,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuditConfig {
    /// Record one audit row per request (audit shards, written after the
    /// response).
    pub enabled: bool,
    /// The time span of one audit shard (ms; default one UTC day, ADR 0016).
    pub bucket_ms: u64,
}

impl Default for AuditConfig {
    fn default() -> Self {
        AuditConfig {
            enabled: true,
            bucket_ms: DEFAULT_BUCKET_MS,
        }
    }
}

/// The three sections, in one function because `audit.bucket_ms` has always
/// been checked between the two retention fields (the first error named
/// stays the same).
pub(super) fn validate(
    retention: &RetentionConfig,
    audit: &AuditConfig,
    archive: &ArchiveConfig,
) -> Result<(), ConfigError> {
    // 0: keep only the current bucket (for tests).
    range("retention.audit_days", retention.audit_days, 0, 3_650)?;
    range(
        "audit.bucket_ms",
        audit.bucket_ms,
        MIN_BUCKET_MS,
        MAX_BUCKET_MS,
    )?;
    range(
        "retention.deliveries_days",
        retention.deliveries_days,
        0,
        3_650,
    )?;
    range("archive.keep_days", archive.keep_days, 1, 36_500)
}
