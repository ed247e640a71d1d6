//! The scheduled jobs (cron trigger): retention of the audit log and of the
//! delivery log, re-queueing of deliveries whose next attempt is overdue, and
//! (every minute) the publish outbox sweep.
//! Each job logs its own failure; none stops the others.

use crate::log;
use postguard_core::config::Config;
use postguard_core::log::Line;
use worker::Env;

use crate::{audit, webhooks};

/// The every-minute trigger (wrangler.toml): only the outbox sweep.
pub const EVERY_MINUTE: &str = "* * * * *";

/// Runs the jobs of trigger `cron`: the outbox sweep on every trigger, the
/// retention and overdue re-queueing on the others (the daily one).
pub async fn run(env: &Env, cfg: &Config, cron: &str) {
    match webhooks::publish::sweep_outbox(env, cfg.settings.webhooks.outbox_after_s).await {
        Ok(0) => {}
        Ok(n) => {
            log::emit(Line::warn("outbox: enqueued deliveries left unsent").field("deliveries", n))
        }
        Err(e) => log::emit(Line::error("outbox sweep failed").err(e)),
    }
    if cron == EVERY_MINUTE {
        return;
    }
    let days = cfg.settings.retention.audit_days;
    match audit::sweep(env, days).await {
        Ok((buckets, legacy)) => log::emit(
            Line::info("audit retention")
                .field("days", days)
                .field("buckets_dropped", buckets)
                .field("legacy_rows_deleted", legacy),
        ),
        Err(e) => log::emit(Line::error("audit retention failed").err(e)),
    }
    let days = cfg.settings.retention.deliveries_days;
    match webhooks::retention::sweep(env, days).await {
        Ok(s) => log::emit(
            Line::info("delivery retention")
                .field("days", days)
                .field("shards_dropped", s.shards)
                .field("legacy_deliveries_deleted", s.deliveries)
                .field("events_deleted", s.events),
        ),
        Err(e) => log::emit(Line::error("delivery retention failed").err(e)),
    }
    match webhooks::consumer::requeue_stuck(env, cfg, cfg.settings.webhooks.requeue_after_s).await {
        Ok(0) => {}
        Ok(n) => log::emit(Line::warn("re-queued overdue deliveries").field("deliveries", n)),
        Err(e) => log::emit(Line::error("re-queueing overdue deliveries failed").err(e)),
    }
}
