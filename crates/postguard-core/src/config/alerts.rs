//! The `alerts` section: who is told of the deployment's alerts and when
//! the queue's lag and a store's size call for one.

use serde::Deserialize;

use super::check::{range, ConfigError};
use crate::ids::is_valid_name;

/// Operational alerts (ADR 0038): `postguard.queue.lagging` and
/// `postguard.storage.high_water`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AlertsConfig {
    /// The operator's own project: its subscriptions receive the alerts
    /// about the deployment (the queue, D1) and a copy of every project's.
    /// Unset: those are only logged.
    pub project: Option<String>,
    /// `postguard.queue.lagging` when the oldest due delivery is older than this (s).
    pub queue_lag_s: u32,
    /// `postguard.storage.high_water` when a store reaches this share of the
    /// mark at which it refuses writes (percent).
    pub storage_percent: u32,
    /// One alert per condition per this period at most (s).
    pub period_s: u32,
}

impl Default for AlertsConfig {
    fn default() -> Self {
        AlertsConfig {
            project: None,
            queue_lag_s: 300,
            storage_percent: 80,
            period_s: 3_600,
        }
    }
}

pub(super) fn validate(al: &AlertsConfig) -> Result<(), ConfigError> {
    if let Some(p) = &al.project {
        if !is_valid_name(p) {
            return Err(ConfigError::new(
                "alerts.project",
                "must be 1-64 characters of [A-Za-z0-9._-]",
            ));
        }
    }
    range("alerts.queue_lag_s", al.queue_lag_s, 1, 86_400)?;
    range("alerts.storage_percent", al.storage_percent, 1, 100)?;
    range("alerts.period_s", al.period_s, 60, 30 * 86_400)
}
