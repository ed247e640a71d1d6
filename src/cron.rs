//! The scheduled jobs (cron trigger): retention of the audit log and of the
//! delivery log, re-queueing of deliveries whose next attempt is overdue, and
//! (every minute) the publish outbox sweep.
//! Each job logs its own failure; none stops the others.

use postguard_core::config::Config;
use worker::Env;

use crate::{audit, webhooks};

/// The every-minute trigger (wrangler.toml): only the outbox sweep.
pub const EVERY_MINUTE: &str = "* * * * *";

/// Runs the jobs of trigger `cron`: the outbox sweep on every trigger, the
/// retention and overdue re-queueing on the others (the daily one).
pub async fn run(env: &Env, cfg: &Config, cron: &str) {
    match webhooks::publish::sweep_outbox(env, cfg.settings.webhooks.outbox_after_s).await {
        Ok(0) => {}
        Ok(n) => worker::console_warn!("outbox: enqueued {} deliveries left unsent", n),
        Err(e) => worker::console_error!("outbox sweep failed: {}", e),
    }
    if cron == EVERY_MINUTE {
        return;
    }
    let days = cfg.settings.retention.audit_days;
    match audit::sweep(env, days).await {
        Ok((buckets, legacy)) => worker::console_log!(
            "audit retention ({} days): dropped {} buckets, deleted {} legacy rows",
            days,
            buckets,
            legacy
        ),
        Err(e) => worker::console_error!("audit retention failed: {}", e),
    }
    let days = cfg.settings.retention.deliveries_days;
    match webhooks::retention::sweep(env, days).await {
        Ok(s) => worker::console_log!(
            "delivery retention: dropped {} shards, deleted {} legacy deliveries and {} events older than {} days",
            s.shards,
            s.deliveries,
            s.events,
            days
        ),
        Err(e) => worker::console_error!("delivery retention failed: {}", e),
    }
    match webhooks::consumer::requeue_stuck(env, cfg, cfg.settings.webhooks.requeue_after_s).await {
        Ok(0) => {}
        Ok(n) => worker::console_warn!("re-queued {} overdue deliveries", n),
        Err(e) => worker::console_error!("re-queueing overdue deliveries failed: {}", e),
    }
}
