//! The scheduled jobs (cron trigger): the compliance archive and retention
//! of the audit log and of the delivery log (nothing deleted that the
//! archive, when on, has not written and verified), re-queueing of
//! deliveries whose next attempt is overdue, and (every minute) the publish
//! outbox sweep and the operational alerts.
//! Each job logs its own failure; none stops the others.

use crate::log;
use postguard_core::config::Config;
use postguard_core::log::Line;
use worker::Env;

use crate::archive::Archiver;
use crate::runtime::now_ms;
use crate::{audit, webhooks};
use postguard_core::archive::archive_cutoff;
use postguard_core::audit::retention_cutoff_ms;

/// The every-minute trigger (wrangler.toml): the outbox sweep and the
/// operational alerts' check.
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
    match crate::alerts::check(env, cfg).await {
        Ok(0) => {}
        Ok(n) => log::emit(Line::info("operational alerts published").field("alerts", n)),
        Err(e) => log::emit(Line::error("alerts check failed").err(e)),
    }
    if cron == EVERY_MINUTE {
        return;
    }
    let now = now_ms();
    let settings = &cfg.settings;
    // With the archive on, whole UTC days only: a day's object is complete
    // once all its sources are archived (ADR 0038).
    let archiver = match settings.archive.enabled {
        false => None,
        true => match Archiver::new(env, now) {
            Ok(a) => Some(a),
            Err(e) => {
                // Nothing is deleted that is not archived: retention waits.
                log::emit(Line::error("archive unavailable: retention skipped").err(e));
                return;
            }
        },
    };
    let cutoff_of = |days: u32| {
        let c = retention_cutoff_ms(now, days);
        match archiver {
            Some(_) => archive_cutoff(c),
            None => c,
        }
    };
    let days = settings.retention.audit_days;
    match audit::sweep(env, cutoff_of(days), archiver.as_ref()).await {
        Ok((buckets, legacy)) => log::emit(
            Line::info("audit retention")
                .field("days", days)
                .field("buckets_dropped", buckets)
                .field("legacy_rows_deleted", legacy),
        ),
        Err(e) => log::emit(Line::error("audit retention failed").err(e)),
    }
    let days = settings.retention.deliveries_days;
    match webhooks::retention::sweep(env, now, cutoff_of(days), days, archiver.as_ref()).await {
        Ok(s) => log::emit(
            Line::info("delivery retention")
                .field("days", days)
                .field("shards_dropped", s.shards)
                .field("legacy_deliveries_deleted", s.deliveries)
                .field("events_deleted", s.events),
        ),
        Err(e) => log::emit(Line::error("delivery retention failed").err(e)),
    }
    if let Some(a) = &archiver {
        match a.expire(env, settings.archive.keep_days).await {
            Ok(0) => {}
            Ok(n) => log::emit(Line::info("archive: expired objects deleted").field("objects", n)),
            Err(e) => log::emit(Line::error("archive expiry failed").err(e)),
        }
    }
    match webhooks::requeue::requeue_stuck(env, cfg, cfg.settings.webhooks.requeue_after_s).await {
        Ok(0) => {}
        Ok(n) => log::emit(Line::warn("re-queued overdue deliveries").field("deliveries", n)),
        Err(e) => log::emit(Line::error("re-queueing overdue deliveries failed").err(e)),
    }
}
