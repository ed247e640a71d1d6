//! The cron's safety net for deliveries (docs/operating-webhooks.md): those
//! whose next attempt is overdue — a lost message, a failed enqueue — are
//! re-planned due now in their shard and queued again.

use postguard_core::config::Config;
use postguard_core::webhooks::protocol as wire;
use postguard_core::webhooks::records::FirstJob;
use worker::{Env, Result};

use super::{directory, shards, write};
use crate::runtime::now_ms;

/// Cron safety net: deliveries whose next attempt is overdue by
/// `webhooks.requeue_after_s` (a lost message, a failed enqueue) are
/// re-planned due now in their shard and queued again; legacy ones are
/// moved into their shard first.
pub async fn requeue_stuck(env: &Env, cfg: &Config, after_s: u32) -> Result<u32> {
    let now = now_ms();
    let before = now.saturating_sub(u64::from(after_s) * 1_000);
    for r in directory::legacy::overdue(env, before, 500).await? {
        shards::adopt(env, cfg, &r.project, &r.event_id, now).await?;
    }
    let oldest =
        postguard_core::audit::retention_cutoff_ms(now, cfg.settings.retention.deliveries_days);
    let mut n = 0u32;
    for key in directory::shards_since(env, oldest, u32::MAX).await? {
        let req = crate::durable::webhook_shard::BeforeReq {
            before,
            limit: 500,
            now,
            oldest_day: postguard_core::webhooks::capacity::utc_day(now)
                .saturating_sub(u64::from(cfg.settings.retention.deliveries_days)),
        };
        let jobs: Vec<FirstJob> = shards::call::<wire::Requeue>(env, &key, &req).await?;
        // A revoked key's subscriptions receive nothing: the consumer acks them.
        write::send_and_mark(env, &key, &jobs, false).await?;
        n += u32::try_from(jobs.len()).unwrap_or(u32::MAX);
    }
    Ok(n)
}
