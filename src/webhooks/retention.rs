//! The delivery log's retention (the daily cron, ADR 0035): whole shards
//! whose bucket ended before `retention.deliveries_days` are dropped (each
//! object deletes its storage) and leave the directory; then the legacy D1
//! rows past the cutoff, in chunks until none is left (ADR 0017): one round
//! is one D1 batch of at most `capacity::SWEEP_CHUNK` deliveries with their
//! attempts, outbox rows and manual-attempt counts — then events left
//! without deliveries with their publish request ids; then tasks, expired
//! inspectors and old counters.

use postguard_core::webhooks::capacity;
use worker::{Env, Result};

use super::directory;
use super::shards::{self, ops};
use crate::runtime::now_ms;

/// What one daily sweep deleted.
#[derive(Debug, Default)]
pub struct Swept {
    pub shards: u64,
    pub deliveries: u64,
    pub events: u64,
}

pub async fn sweep(env: &Env, days: u32) -> Result<Swept> {
    let now = now_ms();
    let cutoff = postguard_core::audit::retention_cutoff_ms(now, days);
    let mut swept = Swept::default();
    loop {
        let expired = directory::expired(env, cutoff, 100).await?;
        if expired.is_empty() {
            break;
        }
        for key in expired {
            let _: serde_json::Value = shards::call(env, &key, ops::DROP, &()).await?;
            directory::forget(env, &key).await?;
            swept.shards += 1;
        }
    }
    for round in 0.. {
        let n = directory::legacy::deliveries_round(env, cutoff).await?;
        swept.deliveries += n;
        if !capacity::sweep_again(n, round) {
            break;
        }
    }
    for round in 0.. {
        let n = directory::legacy::events_round(env, cutoff).await?;
        swept.events += n;
        if !capacity::sweep_again(n, round) {
            break;
        }
    }
    let oldest_day = capacity::utc_day(now).saturating_sub(u64::from(days));
    directory::legacy::sweep_rest(env, cutoff, now, oldest_day).await?;
    Ok(swept)
}
