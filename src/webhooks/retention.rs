//! The delivery log's retention (the daily cron, ADR 0035): whole shards
//! whose bucket ended before `retention.deliveries_days` are dropped (each
//! object deletes its storage) and leave the directory; then the legacy D1
//! rows past the cutoff, in chunks until none is left (ADR 0017): one round
//! is one D1 batch of at most `capacity::SWEEP_CHUNK` deliveries with their
//! attempts, outbox rows and manual-attempt counts — then events left
//! without deliveries with their publish request ids; then tasks, expired
//! inspectors and old counters.

use postguard_core::webhooks::capacity;
use postguard_core::webhooks::protocol::{self as wire, Done};
use worker::{Env, Result};

use postguard_core::archive::{Kind, Source};
use postguard_core::log::Line;
use postguard_core::webhooks::shard::ShardKey;

use super::directory;
use super::shards;
use crate::archive::Archiver;
use crate::log;

/// What one daily sweep deleted.
#[derive(Debug, Default)]
pub struct Swept {
    pub shards: u64,
    pub deliveries: u64,
    pub events: u64,
}

/// With the archive on (`archive`), a shard or legacy day is deleted only
/// once archived and verified; what could not be is kept for the next run.
pub async fn sweep(
    env: &Env,
    now: u64,
    cutoff: u64,
    days: u32,
    archive: Option<&Archiver>,
) -> Result<Swept> {
    let mut swept = Swept::default();
    // Shards the archive could not secure this run (they stay listed).
    let mut kept: Vec<ShardKey> = Vec::new();
    loop {
        let listed = directory::expired(env, cutoff, 100 + kept.len() as u32).await?;
        let expired: Vec<ShardKey> = listed.into_iter().filter(|k| !kept.contains(k)).collect();
        if expired.is_empty() {
            break;
        }
        for key in expired {
            if let Some(a) = archive {
                if !secured(env, a, &key).await {
                    kept.push(key);
                    continue;
                }
            }
            shards::call::<wire::Drop>(env, &key, &Done {}).await?;
            directory::forget(env, &key).await?;
            swept.shards += 1;
        }
    }
    let legacy_cutoff = match archive {
        None => cutoff,
        Some(a) => a.legacy_cutoff(env, Kind::Deliveries, cutoff).await?,
    };
    for round in 0.. {
        let n = directory::legacy::deliveries_round(env, legacy_cutoff).await?;
        swept.deliveries += n;
        if !capacity::sweep_again(n, round) {
            break;
        }
    }
    for round in 0.. {
        let n = directory::legacy::events_round(env, legacy_cutoff).await?;
        swept.events += n;
        if !capacity::sweep_again(n, round) {
            break;
        }
    }
    let oldest_day = capacity::utc_day(now).saturating_sub(u64::from(days));
    directory::legacy::sweep_rest(env, cutoff, now, oldest_day).await?;
    Ok(swept)
}

/// Whether the archive holds the shard's deliveries (archived now if need
/// be) and verified them; a failure is logged and keeps the shard.
async fn secured(env: &Env, a: &Archiver, key: &ShardKey) -> bool {
    let span = match directory::span(env, key).await {
        Ok(Some(span)) => span,
        Ok(None) => return true,
        Err(e) => {
            log::emit(Line::error("delivery retention: reading a shard's span failed").err(e));
            return false;
        }
    };
    let source = Source::Shard {
        start_ms: span.0,
        end_ms: span.1,
    };
    match a
        .secure(env, &key.project, Kind::Deliveries, source, span)
        .await
    {
        Ok(ok) => ok,
        Err(e) => {
            log::emit(
                Line::error("delivery retention: archiving a shard failed: it is kept")
                    .field("project", key.project.as_str())
                    .field("start_ms", key.start_ms)
                    .err(e),
            );
            false
        }
    }
}
